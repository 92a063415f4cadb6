//! Set-up shared by the end-to-end tests on either backend: ebb's CRDs and namespace, nodes and
//! Deployments (ebb-sim's scenario loader, or API objects for kwok), waits, a pod log, the controller.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use ebb_api::ScaleDownPolicy;

use crate::harness::{Backend, ChildProcess, TestEnv, steering_args, wait_for, workspace_binary};
use ebb_sim::SimConfig;
use ebb_sim::scenario::Scenario;

/// The grace period ebb-sim gives a pod that sets none (in sim time).
const SIM_DEFAULT_GRACE_SECS: f64 = 30.0;

/// A test's cluster with ebb's CRDs and the `ebb-system` namespace, and the sim's time factor,
/// which the real backend mirrors in pod grace periods and kwok start delays.
pub struct Cluster {
    pub env: TestEnv,
    pub time_factor: f64,
}

impl Cluster {
    /// Starts `backend` (a real control plane without nodes: tests create their own) at
    /// `time_factor` (the sim's; on real, what takes 30 s of sim time takes `30 / factor` s).
    pub async fn start(backend: Backend, time_factor: f64) -> anyhow::Result<Self> {
        let env = TestEnv::start_on(
            backend,
            SimConfig {
                time_factor,
                ..SimConfig::default()
            },
            0,
        )
        .await?;
        let c = env.client.clone();
        match env.sim() {
            Some(sim) => {
                let crds = ebb_api::crdgen::yaml_stream().context("CRDs to YAML")?;
                Scenario::from_manifests(&crds)?.load(&sim.api)?;
            }
            None => {
                for crd in ebb_api::crdgen::crds() {
                    let name = crd.metadata.name.clone().unwrap_or_default();
                    Api::<CustomResourceDefinition>::all(c.clone())
                        .patch(
                            &name,
                            &PatchParams::apply("ebb-e2e").force(),
                            &Patch::Apply(&crd),
                        )
                        .await
                        .with_context(|| format!("applying CRD {name}"))?;
                }
            }
        }
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "ebb-system"}}))?;
        // Already there when the control plane started from a saved etcd (a bench's).
        match Api::<Namespace>::all(c.clone())
            .create(&PostParams::default(), &ns)
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            r => {
                r.context("creating namespace ebb-system")?;
            }
        }
        if env.real().is_some() {
            install_steering_webhook(&c).await?;
            // A CRD serves a little after it is created.
            for plural in ["scaledownpolicies", "nodestates"] {
                wait_for(
                    &format!("{plural}.ebb.dev served"),
                    Duration::from_secs(30),
                    || async {
                        let crd = Api::<CustomResourceDefinition>::all(c.clone())
                            .get_opt(&format!("{plural}.ebb.dev"))
                            .await
                            .ok()??;
                        crd.status?
                            .conditions?
                            .iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                            .then_some(())
                    },
                )
                .await?;
            }
        }
        Ok(Self { env, time_factor })
    }

    pub fn client(&self) -> &kube::Client {
        &self.env.client
    }

    pub fn backend(&self) -> Backend {
        self.env.backend()
    }

    /// A sim-time duration as real time (what the sim takes `sim` for takes this long).
    pub fn real_time(&self, sim: Duration) -> Duration {
        sim.div_f64(self.time_factor.max(f64::MIN_POSITIVE))
    }

    /// The grace period the real backend gives pods: the sim's default (30 s of sim time) in
    /// real time, at least a second.
    pub fn grace_secs(&self) -> i64 {
        (SIM_DEFAULT_GRACE_SECS / self.time_factor).round().max(1.0) as i64
    }

    /// Creates `g.count` nodes `<prefix><i>` and waits until they are Ready.
    pub async fn add_nodes(&self, g: &NodeGroup<'_>) -> anyhow::Result<()> {
        match self.env.sim() {
            Some(sim) => {
                let scenario = json!({"nodes": {"count": g.count, "namePrefix": g.prefix,
                    "cpu": g.cpu, "memory": g.memory, "labels": g.labels, "taints": g.taints}});
                Scenario::from_yaml(&scenario.to_string())?.load(&sim.api)?;
            }
            None => {
                let api: Api<Node> = Api::all(self.env.client.clone());
                for i in 0..g.count {
                    let name = format!("{}{i}", g.prefix);
                    let node: Node = serde_json::from_value(kwok_node(&name, g))?;
                    api.create(&PostParams::default(), &node)
                        .await
                        .with_context(|| format!("creating node {name}"))?;
                }
            }
        }
        wait_ready(self.client(), g.prefix, g.count).await
    }

    /// Creates `a.count` Deployments `<prefix><i>` (label `app: <name>`, each with its
    /// PodDisruptionBudget when `a.pdb` is set) as ebb-sim's scenario generator does.
    pub async fn add_apps(&self, a: &Apps<'_>) -> anyhow::Result<()> {
        if let Some(sim) = self.env.sim() {
            let mut ann = serde_json::Map::new();
            if a.never_ready {
                ann.insert("sim.ebb.dev/fail-start".into(), json!("true"));
            }
            if let Some(d) = a.ready_after {
                let sim_secs = d.as_secs_f64() * self.time_factor;
                ann.insert(
                    "sim.ebb.dev/start-delay".into(),
                    json!(format!("{sim_secs:.0}s")),
                );
            }
            let mut g = json!({"count": a.count, "namePrefix": a.prefix, "replicas": a.replicas,
                "requests": a.requests, "labels": a.labels, "podAnnotations": ann});
            if let Some(p) = &a.pdb {
                g["pdb"] = p.clone();
            }
            let scenario = json!({"deployments": [g]});
            Scenario::from_yaml(&scenario.to_string())?.load(&sim.api)?;
            return Ok(());
        }
        let c = self.env.client.clone();
        for i in 0..a.count {
            let name = format!("{}{i}", a.prefix);
            let mut labels = a.labels.as_object().cloned().unwrap_or_default();
            labels.insert("app".into(), json!(name));
            let mut ann = serde_json::Map::new();
            // kwok's pod-ready stage: its delay from the pod's annotations (the jitter too: a
            // jitter shorter than the delay would replace it).
            let ready_after = if a.never_ready {
                ann.insert(NEVER_READY.into(), json!("true"));
                ann.insert("pod-ready.stage.kwok.x-k8s.io/weight".into(), json!("0"));
                None
            } else {
                a.ready_after
            };
            if let Some(d) = ready_after {
                let ms = format!("{}ms", d.as_millis());
                ann.insert("pod-ready.stage.kwok.x-k8s.io/delay".into(), json!(ms));
                ann.insert(
                    "pod-ready.stage.kwok.x-k8s.io/jitter-delay".into(),
                    json!(ms),
                );
            }
            let d: Deployment = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "labels": labels},
                "spec": {"replicas": a.replicas, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": labels, "annotations": ann},
                        "spec": {"terminationGracePeriodSeconds": self.grace_secs(),
                            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": a.requests}}]}}}
            }))?;
            Api::<Deployment>::namespaced(c.clone(), "default")
                .create(&PostParams::default(), &d)
                .await
                .with_context(|| format!("creating deployment {name}"))?;
            if let Some(p) = &a.pdb {
                let mut spec = p.clone();
                spec["selector"] = json!({"matchLabels": {"app": name}});
                let pdb: PodDisruptionBudget = serde_json::from_value(
                    json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec}),
                )?;
                Api::<PodDisruptionBudget>::namespaced(c.clone(), "default")
                    .create(&PostParams::default(), &pdb)
                    .await
                    .with_context(|| format!("creating pdb {name}"))?;
            }
        }
        Ok(())
    }

    /// Creates a PodDisruptionBudget given as JSON (in `default` unless it names a namespace).
    pub async fn create_pdb(&self, pdb: Value) -> anyhow::Result<()> {
        let p: PodDisruptionBudget = serde_json::from_value(pdb)?;
        let ns = p
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        Api::<PodDisruptionBudget>::namespaced(self.env.client.clone(), &ns)
            .create(&PostParams::default(), &p)
            .await
            .context("creating a PodDisruptionBudget")?;
        Ok(())
    }
}

/// Applies the chart's steering MutatingWebhookConfiguration ([`crate::rbac::steering_webhook`])
/// on a real cluster: from then on every controller-owned pod's creation calls it (and fails
/// open until a controller points it at itself, see [`steering_args`]).
pub async fn install_steering_webhook(client: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    for doc in crate::rbac::steering_webhook()? {
        let config: MutatingWebhookConfiguration = serde_json::from_value(doc)
            .context("the chart's steering webhook is not a MutatingWebhookConfiguration")?;
        let name = config.metadata.name.clone().unwrap_or_default();
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .patch(
                &name,
                &PatchParams::apply("ebb-e2e").force(),
                &Patch::Apply(&config),
            )
            .await
            .with_context(|| format!("applying the MutatingWebhookConfiguration {name}"))?;
    }
    Ok(())
}

/// The URL the chart's steering webhook configuration calls once a controller registered
/// itself there (a URL with a CA bundle, the chart's Service replaced); `None` before that.
pub async fn steering_registered_url(client: &kube::Client) -> Option<String> {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    let name = crate::rbac::steering_webhook()
        .ok()?
        .first()?
        .pointer("/metadata/name")?
        .as_str()?
        .to_string();
    let cfg = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get_opt(&name)
        .await
        .ok()??;
    let cc = cfg.webhooks?.into_iter().next()?.client_config;
    (cc.ca_bundle.is_some() && cc.service.is_none())
        .then_some(cc.url)
        .flatten()
}

/// The annotation the real backend's kwok stages keep a pod Running but never Ready by
/// (`e2e/k8s/cluster.sh`), as ebb-sim's `sim.ebb.dev/fail-start` does.
pub const NEVER_READY: &str = "ebb.dev/e2e-never-ready";

/// A group of nodes.
pub struct NodeGroup<'a> {
    pub prefix: &'a str,
    pub count: usize,
    pub cpu: &'a str,
    pub memory: &'a str,
    /// An object of labels.
    pub labels: Value,
    /// An array of taints.
    pub taints: Value,
}

impl<'a> NodeGroup<'a> {
    /// `count` nodes of `cpu` and `memory`, without labels of their own or taints.
    pub fn plain(prefix: &'a str, count: usize, cpu: &'a str, memory: &'a str) -> Self {
        Self {
            prefix,
            count,
            cpu,
            memory,
            labels: json!({}),
            taints: json!([]),
        }
    }

    /// `count` nodes of 2 CPUs and 8Gi labelled `pool` (what a ScaleDownPolicy selects), with a
    /// PreferNoSchedule taint `retiring` of their own so that replacements go elsewhere.
    pub fn retiring(prefix: &'a str, count: usize, pool: &str) -> Self {
        Self {
            labels: json!({"pool": pool}),
            taints: json!([{"key": "retiring", "value": "true", "effect": "PreferNoSchedule"}]),
            ..Self::plain(prefix, count, "2", "8Gi")
        }
    }
}

/// A group of Deployments.
pub struct Apps<'a> {
    pub prefix: &'a str,
    pub count: usize,
    pub replicas: i64,
    /// An object: `{cpu: 500m, memory: 256Mi}`.
    pub requests: Value,
    /// Extra labels of the Deployments and their pods.
    pub labels: Value,
    /// A PodDisruptionBudget spec without selector (`{maxUnavailable: 1}`).
    pub pdb: Option<Value>,
    /// Pods start but never become Ready.
    pub never_ready: bool,
    /// Pods become Ready this long (real time) after they start.
    pub ready_after: Option<Duration>,
}

impl Default for Apps<'_> {
    fn default() -> Self {
        Self {
            prefix: "app-",
            count: 1,
            replicas: 1,
            requests: json!({"cpu": "500m", "memory": "256Mi"}),
            labels: json!({}),
            pdb: None,
            never_ready: false,
            ready_after: None,
        }
    }
}

/// A kwok node as `e2e/k8s/cluster.sh` makes them, with the group's size, labels and taints.
fn kwok_node(name: &str, g: &NodeGroup<'_>) -> Value {
    let mut labels = g.labels.as_object().cloned().unwrap_or_default();
    for (k, v) in [
        ("type", "kwok"),
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
    ] {
        labels.insert(k.into(), json!(v));
    }
    let res = json!({"cpu": g.cpu, "memory": g.memory, "pods": "110"});
    json!({
        "metadata": {"name": name, "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"providerID": format!("kwok://{name}"), "taints": g.taints},
        "status": {"capacity": res, "allocatable": res,
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"}}
    })
}

// ---- ScaleDownPolicies ------------------------------------------------------------------

/// A ScaleDownPolicy spec that acts fast on the nodes labelled `pool`: draining and deleting,
/// a scan every second, no unneeded time, 10 drains at once, evictions retried every 200 ms.
pub fn fast_policy_spec(pool: &str) -> Value {
    json!({
        "nodeSelector": {"matchLabels": {"pool": pool}},
        "mode": "DrainAndDelete",
        "scanInterval": "1s",
        "unneededTime": "0s",
        "maxScaleDownParallelism": 10,
        "maxDrainParallelism": 10,
        "evictionRetryInterval": "200ms",
        "maxPodEvictionTime": "60s",
        "recentEvictionWindow": "5s",
    })
}

/// `base` with the fields of `extra` set over it (both objects).
pub fn merged(mut base: Value, extra: &Value) -> Value {
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    base
}

/// Creates the ScaleDownPolicy `name` with `spec`, retrying for 20 s: a fresh CRD may refuse
/// the first create for a moment.
pub async fn create_policy(client: &kube::Client, name: &str, spec: Value) -> anyhow::Result<()> {
    let p: ScaleDownPolicy = serde_json::from_value(json!({
        "apiVersion": "ebb.dev/v1alpha1",
        "kind": "ScaleDownPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }))?;
    let api = Api::<ScaleDownPolicy>::all(client.clone());
    wait_for("the policy created", Duration::from_secs(20), || async {
        api.create(&PostParams::default(), &p).await.ok()
    })
    .await?;
    Ok(())
}

// ---- reading the cluster -----------------------------------------------------------------

pub fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// `namespace/name`.
pub fn key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Running, Ready and not being deleted.
pub fn is_running(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Running")
                && s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// Pods that are Running and Ready.
pub async fn running_pods(client: &kube::Client) -> Vec<Pod> {
    match Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => l.items.into_iter().filter(is_running).collect(),
        Err(_) => Vec::new(),
    }
}

/// Waits until exactly `n` pods run.
pub async fn wait_running(client: &kube::Client, n: usize) -> anyhow::Result<()> {
    wait_for(
        &format!("{n} pods running"),
        Duration::from_secs(60),
        || async { (running_pods(client).await.len() == n).then_some(()) },
    )
    .await
}

/// Every node by name (empty when the API server does not answer).
pub async fn nodes(client: &kube::Client) -> BTreeMap<String, Node> {
    match Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => l
            .items
            .into_iter()
            .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
            .collect(),
        Err(_) => BTreeMap::new(),
    }
}

pub fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

/// Waits until `count` nodes named `prefix…` are Ready and untainted by the node lifecycle
/// controller (the scheduler places pods only there).
pub async fn wait_ready(client: &kube::Client, prefix: &str, count: usize) -> anyhow::Result<()> {
    wait_for(
        &format!("{count} {prefix} nodes ready"),
        Duration::from_secs(60),
        || async {
            let ready = nodes(client)
                .await
                .values()
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
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                // kube-controller-manager taints a new node not-ready until it sees it Ready
                // (up to its node-monitor period later): until then the scheduler avoids it.
                .filter(|n| {
                    !has_taint(n, "node.kubernetes.io/not-ready")
                        && !has_taint(n, "node.kubernetes.io/unreachable")
                })
                .count();
            (ready == count).then_some(())
        },
    )
    .await
}

/// A pod with no controller, bound to `node` directly (as a kubelet-bound pod is).
pub async fn bare_pod(client: &kube::Client, name: &str, node: &str) -> anyhow::Result<()> {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m"}}}]},
    }))?;
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &p)
        .await
        .with_context(|| format!("creating pod {name}"))?;
    Ok(())
}

// ---- a log of pods -----------------------------------------------------------------------

/// What a watch of all pods saw of one pod (kept after the pod is gone).
#[derive(Clone, Debug, Default)]
pub struct PodSeen {
    /// The node it was last seen bound to.
    pub node: String,
    pub labels: BTreeMap<String, String>,
    /// The owner's `kind/name`.
    pub owner: Option<String>,
    pub requests_cpu_milli: i64,
    pub first_seen: Option<Instant>,
    /// When it was first seen Running and Ready.
    pub running_at: Option<Instant>,
    /// When it was first seen with a deletion timestamp.
    pub terminating_at: Option<Instant>,
}

/// One change of a pod, in the order of the watch (the API server's order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodChange {
    Ready(String),
    Terminating(String),
}

#[derive(Default)]
struct PodLogInner {
    pods: HashMap<String, PodSeen>,
    changes: Vec<PodChange>,
}

/// A watch over all pods, from the test's start: where each pod ran, when it became Ready and
/// when it began terminating, and those changes in the API server's order.
#[derive(Clone, Default)]
pub struct PodLog(Arc<Mutex<PodLogInner>>);

impl PodLog {
    /// Starts watching; the task ends when the returned handle is dropped (aborted).
    pub fn watch(client: &kube::Client) -> (Self, AbortOnDrop) {
        let log = Self::default();
        let l = log.clone();
        (log, watch_all(client, move |p: &Pod| l.see(p)))
    }

    fn see(&self, p: &Pod) {
        let now = Instant::now();
        let k = key(p);
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *g;
        let seen = inner.pods.entry(k.clone()).or_default();
        seen.first_seen.get_or_insert(now);
        let node = node_of(p);
        if !node.is_empty() {
            seen.node = node;
        }
        seen.labels = p.metadata.labels.clone().unwrap_or_default();
        seen.owner = p
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| format!("{}/{}", o.kind, o.name));
        seen.requests_cpu_milli = p
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get("cpu"))
            .map(|q| cpu_milli(&q.0))
            .sum();
        if is_running(p) && seen.running_at.is_none() {
            seen.running_at = Some(now);
            inner.changes.push(PodChange::Ready(k.clone()));
        }
        if p.metadata.deletion_timestamp.is_some() && seen.terminating_at.is_none() {
            seen.terminating_at = Some(now);
            inner.changes.push(PodChange::Terminating(k));
        }
    }

    /// The node a pod (`namespace/name`) was last seen on.
    pub fn node(&self, pod: &str) -> Option<String> {
        self.get(pod).map(|p| p.node).filter(|n| !n.is_empty())
    }

    pub fn get(&self, pod: &str) -> Option<PodSeen> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .get(pod)
            .cloned()
    }

    pub fn all(&self) -> HashMap<String, PodSeen> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .clone()
    }

    pub fn changes(&self) -> Vec<PodChange> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .changes
            .clone()
    }
}

/// CPU quantity in millicores (`500m`, `2`, `0.5`); unknown forms count 0.
pub fn cpu_milli(q: &str) -> i64 {
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().unwrap_or(0);
    }
    q.parse::<f64>().map_or(0, |c| (c * 1000.0).round() as i64)
}

/// A watch over all nodes, from the test's start: where in the API server's order of node events
/// each taint key first showed on each node.
#[derive(Clone, Default)]
pub struct TaintLog(Arc<Mutex<TaintLogInner>>);

#[derive(Default)]
struct TaintLogInner {
    events: usize,
    /// Taint key → node → the number of the node event that first showed it.
    first: BTreeMap<String, BTreeMap<String, usize>>,
}

impl TaintLog {
    /// Starts watching; the task ends when the returned handle is dropped (aborted).
    pub fn watch(client: &kube::Client) -> (Self, AbortOnDrop) {
        let log = Self::default();
        let l = log.clone();
        (log, watch_all(client, move |n: &Node| l.see(n)))
    }

    fn see(&self, n: &Node) {
        let name = n.metadata.name.clone().unwrap_or_default();
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.events += 1;
        let at = g.events;
        for t in n.spec.iter().flat_map(|s| s.taints.iter().flatten()) {
            g.first
                .entry(t.key.clone())
                .or_default()
                .entry(name.clone())
                .or_insert(at);
        }
    }

    /// Node → the number of the node event that first showed taint `key` on it.
    pub fn first_shown(&self, key: &str) -> BTreeMap<String, usize> {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.first.get(key).cloned().unwrap_or_default()
    }
}

/// Watches every object of kind `K` from now, handing each one added or changed (or listed) to
/// `see`, until the returned handle is dropped.
fn watch_all<K, F>(client: &kube::Client, mut see: F) -> AbortOnDrop
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
    F: FnMut(&K) + Send + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    AbortOnDrop(tokio::spawn(async move {
        let mut s = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        while let Some(ev) = s.next().await {
            if let Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = ev {
                see(&o);
            }
        }
    }))
}

/// A task aborted when this is dropped.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

// ---- the controller ----------------------------------------------------------------------

/// The `recheck` of [`Controller::spawn`] that leaves `--recheck-delay` at the controller's
/// default (as users run it).
pub const DEFAULT_RECHECK: &str = "";

/// A running `ebb-controller run`; its log is kept and printed when the test fails.
pub struct Controller {
    pub child: ChildProcess,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Controller {
    /// Its flags; `recheck` is `--recheck-delay` ([`DEFAULT_RECHECK`]: the controller's own
    /// default, no flag).
    fn args<'a>(identity: &'a str, leader_election: bool, recheck: &'a str) -> Vec<&'a str> {
        let mut args = vec![
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--leader-election",
            if leader_election { "true" } else { "false" },
            "--namespace",
            "ebb-system",
            "--identity",
            identity,
            "--log-filter",
            "info",
        ];
        if recheck != DEFAULT_RECHECK {
            args.extend(["--recheck-delay", recheck]);
        }
        args
    }

    /// Starts the controller as `user` (its identity in the Lease too), through the harness.
    pub fn spawn(
        env: &TestEnv,
        user: &str,
        leader_election: bool,
        recheck: &str,
    ) -> anyhow::Result<Self> {
        Self::spawn_with(env, user, leader_election, recheck, &[])
    }

    /// [`Self::spawn`] with more flags (for example `--cluster-api`).
    pub fn spawn_with(
        env: &TestEnv,
        user: &str,
        leader_election: bool,
        recheck: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let mut args = Self::args(user, leader_election, recheck);
        args.extend_from_slice(extra);
        let mut child = env.spawn_binary_as(user, "ebb-controller", &args)?;
        let log = child.capture_output();
        Ok(Self { child, log })
    }

    /// Starts the controller with a kubeconfig of its own on the real backend (for example one
    /// that impersonates `user`, so the API server's audit log tells replicas apart), serving
    /// the steering webhook as [`steering_args`] says.
    pub fn spawn_with_kubeconfig(
        kubeconfig: &Path,
        user: &str,
        leader_election: bool,
        recheck: &str,
    ) -> anyhow::Result<Self> {
        let path = workspace_binary("ebb-controller")?;
        let args = Self::args(user, leader_election, recheck);
        let steering = steering_args(Backend::Real, "ebb-controller", &args)?;
        let child = tokio::process::Command::new(&path)
            .args(&args)
            .args(&steering)
            .env("KUBECONFIG", kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", path.display()))?;
        let mut child = ChildProcess {
            name: format!("ebb-controller ({user})"),
            child,
        };
        let log = child.capture_output();
        Ok(Self { child, log })
    }

    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await
    }

    /// Whether a log line contains `text`.
    pub fn logged(&self, text: &str) -> bool {
        self.lines().iter().any(|l| l.contains(text))
    }

    /// Its log so far, without terminal colour codes.
    pub fn lines(&self) -> Vec<String> {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|l| strip_ansi(l))
            .collect()
    }

    /// Still running (has not exited).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.child.try_wait(), Ok(None))
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        // Printed when the test fails, or always with EBB_E2E_CONTROLLER_LOG set.
        if std::thread::panicking() || std::env::var_os("EBB_E2E_CONTROLLER_LOG").is_some() {
            let log = self.lines();
            let start = log.len().saturating_sub(150);
            eprintln!(
                "---- {} log (last {} lines) ----",
                self.child.name,
                log.len() - start
            );
            for l in &log[start..] {
                eprintln!("{l}");
            }
        }
    }
}

/// Starts `ebb-node-agent` standing in for `node`: state and cache under `dir`, no Unix
/// socket, probes and `/metrics` on a free loopback port, a report every second, token keys in
/// `token_secret` (`namespace/name`); as the chart's ServiceAccount on the real backend.
pub fn spawn_node_agent(
    env: &TestEnv,
    node: &str,
    dir: &Path,
    token_secret: &str,
) -> anyhow::Result<ChildProcess> {
    let state = dir.join("state");
    let cache = dir.join("cache");
    let (Some(state), Some(cache)) = (state.to_str(), cache.to_str()) else {
        bail!("the agent's directory {} is not UTF-8", dir.display());
    };
    let args = [
        "run",
        "--node-name",
        node,
        "--state-dir",
        state,
        "--cache-dir",
        cache,
        "--no-socket",
        "--listen-addr",
        "127.0.0.1:0",
        "--report-interval-secs",
        "1",
        "--token-secret",
        token_secret,
    ];
    env.spawn_binary_as("ebb-node-agent", "ebb-node-agent", &args)
}

/// The `/metrics` address a binary logged (`serving /metrics ... addr=<ip:port>`), if it did.
pub fn metrics_address(log: &[String]) -> Option<String> {
    log.iter()
        .filter(|l| l.contains("serving /metrics"))
        .find_map(|l| {
            let l = strip_ansi(l);
            let rest = &l[l.find("addr=")? + 5..];
            let a: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                .collect();
            (!a.is_empty()).then_some(a)
        })
}

/// The `/metrics` response at `addr`, headers and body, asking for `accept` (the classic text
/// format when `None`; Prometheus asks `application/openmetrics-text;version=1.0.0`).
pub async fn fetch_metrics(addr: &str, accept: Option<&str>) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to /metrics at {addr}"))?;
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    conn.write_all(format!("GET /metrics HTTP/1.0\r\nHost: x\r\n{accept}\r\n").as_bytes())
        .await?;
    let mut body = String::new();
    conn.read_to_string(&mut body).await?;
    Ok(body)
}

/// `text` without ANSI escape sequences (`ESC [ ... letter`).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A copy of the real cluster's admin kubeconfig that impersonates `user` in group
/// `system:masters`: the audit log records requests made with it as `user`.
pub fn impersonating_kubeconfig(env: &TestEnv, user: &str) -> anyhow::Result<PathBuf> {
    let Some(real) = env.real() else {
        bail!("impersonation kubeconfigs are for the real backend");
    };
    let text = std::fs::read_to_string(real.kubeconfig()).context("reading the kubeconfig")?;
    let mut cfg: Value = serde_saphyr::from_str(&text).context("parsing the kubeconfig")?;
    let users = cfg
        .get_mut("users")
        .and_then(Value::as_array_mut)
        .context("the kubeconfig has no users")?;
    for u in users {
        if let Some(auth) = u.get_mut("user").and_then(Value::as_object_mut) {
            auth.insert("as".into(), json!(user));
            auth.insert("as-groups".into(), json!(["system:masters"]));
        }
    }
    let path = real.dir().join(format!("kubeconfig-as-{user}"));
    std::fs::write(&path, serde_json::to_string_pretty(&cfg)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The user the audit log records for the controller: found as the writer of the policy
/// `policy`'s status (only the controller writes it), waiting up to 30 s for the first write.
pub async fn controller_audit_user(env: &TestEnv, policy: &str) -> anyhow::Result<String> {
    wait_for(
        &format!("the controller's first status write to {policy}"),
        Duration::from_secs(30),
        || async {
            env.audit()
                .ok()?
                .into_iter()
                .find(|r| {
                    r.resource == "scaledownpolicies.ebb.dev"
                        && r.subresource == "status"
                        && r.name == policy
                        && (200..300).contains(&r.code)
                })
                .map(|r| r.user)
        },
    )
    .await
}

/// The most pods among those named `prefix*` that were unavailable at once (terminating, or
/// not yet Ready), in the watch's order, counted from the moment `total` of them were Ready.
pub fn peak_unavailable(changes: &[PodChange], prefix: &str, total: usize) -> usize {
    let mut ready: std::collections::BTreeSet<&String> = std::collections::BTreeSet::new();
    let mut full = false;
    let mut peak = 0;
    for c in changes {
        match c {
            PodChange::Ready(p) if p.starts_with(prefix) => {
                ready.insert(p);
            }
            PodChange::Terminating(p) if p.starts_with(prefix) => {
                ready.remove(p);
            }
            _ => continue,
        }
        full |= ready.len() >= total;
        if full {
            peak = peak.max(total.saturating_sub(ready.len()));
        }
    }
    peak
}

/// CPU time (user + system) a process has used so far, from `/proc` (Linux).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) end with `)`.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_codes_are_stripped() {
        let l = "\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \u{1b}[3mpod\u{1b}[0m\u{1b}[2m=\u{1b}[0ma/b";
        assert_eq!(strip_ansi(l), "2026  INFO pod=a/b");
    }

    #[test]
    fn cpu_quantities() {
        assert_eq!(cpu_milli("500m"), 500);
        assert_eq!(cpu_milli("2"), 2000);
        assert_eq!(cpu_milli("0.5"), 500);
    }

    #[test]
    fn unavailable_pods_are_counted_in_watch_order() {
        let r = |p: &str| PodChange::Ready(p.to_string());
        let t = |p: &str| PodChange::Terminating(p.to_string());
        let one_at_a_time = [r("a-1"), r("a-2"), t("a-1"), r("a-3"), t("a-2"), r("a-4")];
        assert_eq!(peak_unavailable(&one_at_a_time, "a-", 2), 1);
        let two_at_once = [r("a-1"), r("a-2"), r("b-1"), t("a-1"), t("a-2"), r("a-3")];
        assert_eq!(peak_unavailable(&two_at_once, "a-", 2), 2);
    }
}
