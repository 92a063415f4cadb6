//! The comparison's scenarios and how their workload is put on a fresh real cluster: kwok nodes
//! both ebb and Cluster Autoscaler's kwok provider accept ([`build`]), or nodes already there
//! such as Karpenter's ([`build_on`]); busy nodes first, then lightly used ones.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::versus::observe::Budget;
use ebb_e2e::harness::wait_for;

/// The namespace the workload runs in.
pub const NAMESPACE: &str = "work";
/// The label (and Cluster Autoscaler kwok node group) of every scenario node.
pub const GROUP_LABEL: &str = "kwok-nodegroup";
pub const GROUP: &str = "pool";
/// The label naming a node's shape: Cluster Autoscaler's kwok provider makes one node group per
/// value ([`GROUP`] on the uniform scenarios, the [`Shape`]'s name on shaped ones).
pub const SHAPE_LABEL: &str = "bench.ebb.dev/shape";
/// The well-known instance-type label: the shape's name on kwok nodes, the instance type on
/// Karpenter's (ebb's `prices.label` by default).
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
/// The label Cluster Autoscaler's kwok provider reads a GPU node's accelerator type from
/// (`nodes.gpuConfig.gpuLabelKey`).
pub const GPU_TYPE_LABEL: &str = "bench.ebb.dev/gpu-type";
/// The accelerator type of every GPU shape, and its extended resource.
pub const GPU_TYPE: &str = "nvidia-a100";
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The node-group annotation Cluster Autoscaler's kwok provider reads the group's minimum size
/// from (set on every scenario node by [`node_object`]).
pub const MIN_COUNT_ANNOTATION: &str = "cluster-autoscaler.kwok.nodegroup/min-count";
/// How long a scaler may work in every scenario before its run is cut: an hour, long enough for
/// Cluster Autoscaler, which looks at a node it found unremovable again only every 5 minutes, to
/// finish (ebb and Karpenter end long before); only a guard against a run that never settles.
pub const CAP: Duration = Duration::from_secs(3600);
/// Grace period of every workload pod (the cluster's kwok removes a pod 1 s after it ends).
const GRACE_SECONDS: i64 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Deployment,
    StatefulSet,
    DaemonSet,
    /// Pods without an owner: no scaler may move them, their node has to stay.
    BarePods,
}

/// One workload of a scenario.
#[derive(Clone, Debug)]
pub struct Workload {
    pub kind: Kind,
    pub name: String,
    /// Replicas (pods for `BarePods`; ignored for a DaemonSet).
    pub replicas: usize,
    pub cpu: &'static str,
    pub memory: &'static str,
    /// A PodDisruptionBudget with this `maxUnavailable` (`"10%"`, `"2"`).
    pub max_unavailable: Option<&'static str>,
    /// Required pod anti-affinity on the hostname: at most one replica per node.
    pub anti_affinity: bool,
    /// Whole GPUs ([`GPU_RESOURCE`]) each pod requests (and is limited to).
    pub gpus: u32,
    /// Replicas after set-up: the Deployment is created with `replicas`, then scaled to this once
    /// they all run (the ReplicaSet controller removes pods from the nodes holding most of them
    /// first, which leaves the rest spread, as jobs that finished leave them).
    pub scale_to: Option<usize>,
}

impl Workload {
    pub fn new(
        kind: Kind,
        name: impl Into<String>,
        replicas: usize,
        cpu: &'static str,
        memory: &'static str,
    ) -> Self {
        Self {
            kind,
            name: name.into(),
            replicas,
            cpu,
            memory,
            max_unavailable: None,
            anti_affinity: false,
            gpus: 0,
            scale_to: None,
        }
    }
    /// Replicas the workload runs once set up ([`Self::scale_to`], else `replicas`).
    pub fn final_replicas(&self) -> usize {
        self.scale_to.unwrap_or(self.replicas)
    }
    pub fn gpus(mut self, gpus: u32) -> Self {
        self.gpus = gpus;
        self
    }
    pub fn scale_to(mut self, replicas: usize) -> Self {
        self.scale_to = Some(replicas);
        self
    }
    pub fn pdb(mut self, max_unavailable: &'static str) -> Self {
        self.max_unavailable = Some(max_unavailable);
        self
    }
    pub fn anti_affinity(mut self) -> Self {
        self.anti_affinity = true;
        self
    }
}

/// One kind of node of a shaped scenario: `count` nodes of `cpu`, `memory` and `gpus`, costing
/// `per_hour`. Its name is the instance type (kwok nodes carry it in [`INSTANCE_TYPE_LABEL`];
/// Karpenter launches an instance type of that name) and Cluster Autoscaler's node group.
#[derive(Clone, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub count: usize,
    pub cpu: &'static str,
    pub memory: &'static str,
    pub gpus: u32,
    pub per_hour: f64,
}

/// A scenario: `nodes` identical kwok nodes (or `shapes`, in their order); DaemonSets everywhere; the `busy` workloads put on
/// the first `light_from` nodes (the others cordoned meanwhile), then the `light` ones, which the
/// scheduler's least-allocated scoring puts on the nodes left nearly empty.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub description: &'static str,
    pub nodes: usize,
    pub node_cpu: &'static str,
    pub node_memory: &'static str,
    /// Nodes of several kinds, in this order (their counts add up to `nodes`; `node_cpu` and
    /// `node_memory` are then unused); empty for `nodes` identical nodes.
    pub shapes: Vec<Shape>,
    pub light_from: usize,
    pub daemonsets: Vec<Workload>,
    pub busy: Vec<Workload>,
    pub light: Vec<Workload>,
    /// Longest a scaler may work: a run whose node count still changes (or whose nodes are still
    /// being drained) this long plus its settle window after the scaler's start is cut.
    pub cap: Duration,
    /// A settle window shorter than the scaler's own timers ([`super::settle_window`]), for
    /// tests that check what a scaler did first: the count such a run ends at may not be final.
    pub settle: Option<Duration>,
}

impl Scenario {
    /// Pods the workload runs (DaemonSet pods counted once per node).
    pub fn pods(&self) -> usize {
        self.daemonsets.len() * self.nodes
            + self
                .busy
                .iter()
                .chain(&self.light)
                .map(Workload::final_replicas)
                .sum::<usize>()
    }

    /// The shape of node `i` (of `nodes`, in order), `None` for a uniform scenario.
    pub fn shape_of(&self, i: usize) -> Option<&Shape> {
        let mut first = 0;
        for shape in &self.shapes {
            if i < first + shape.count {
                return Some(shape);
            }
            first += shape.count;
        }
        None
    }

    /// Whether ebb is given prices (and the figures include GPUs and cost): a shaped scenario.
    pub fn priced(&self) -> bool {
        !self.shapes.is_empty()
    }

    pub fn workloads(&self) -> impl Iterator<Item = &Workload> {
        self.daemonsets.iter().chain(&self.busy).chain(&self.light)
    }
}

/// The DaemonSet every scenario with one runs: 100m and 64Mi on each node.
fn node_exporter() -> Workload {
    Workload::new(Kind::DaemonSet, "node-exporter", 0, "100m", "64Mi")
}

/// Scenario 1: 60 nodes, a third lightly used; Deployments with PDBs `maxUnavailable: 10%`, a
/// StatefulSet and a DaemonSet.
pub fn mixed_60() -> Scenario {
    let mut busy: Vec<Workload> = (0..4)
        .map(|i| {
            Workload::new(Kind::Deployment, format!("api-{i}"), 50, "500m", "256Mi").pdb("10%")
        })
        .collect();
    busy.push(Workload::new(Kind::StatefulSet, "db", 10, "250m", "512Mi").pdb("10%"));
    Scenario {
        name: "mixed-60",
        description: "60 nodes (4 cpu), 40 busy (~65% cpu) and 20 lightly used (~9%); 4 Deployments x 50 and a StatefulSet of 10 on the busy ones, a Deployment of 20 on the light ones, all with PDB maxUnavailable 10%; a DaemonSet on every node",
        nodes: 60,
        node_cpu: "4",
        node_memory: "16Gi",
        shapes: vec![],
        light_from: 40,
        daemonsets: vec![node_exporter()],
        busy,
        light: vec![Workload::new(Kind::Deployment, "batch", 20, "250m", "128Mi").pdb("10%")],
        cap: CAP,
        settle: None,
    }
}

/// Scenario 2: the PDB-paced pool: `nodes` nodes, one pod each, PDB `maxUnavailable: 2`.
pub fn pdb_paced(nodes: usize) -> Scenario {
    Scenario {
        name: "pdb-paced",
        description: "nodes (4 cpu) with one pod (250m) each of one Deployment whose PDB allows 2 unavailable; the pods fit on a few nodes",
        nodes,
        node_cpu: "4",
        node_memory: "16Gi",
        shapes: vec![],
        light_from: nodes,
        daemonsets: vec![],
        busy: vec![Workload::new(Kind::Deployment, "paced", nodes, "250m", "128Mi").pdb("2")],
        light: vec![],
        cap: CAP,
        settle: None,
    }
}

/// Scenario 3: 200 nodes, 3,000 pods of mixed sizes, pods with required anti-affinity, pods that
/// cannot move.
pub fn large_200() -> Scenario {
    let mut busy = Vec::new();
    for (prefix, count, replicas, cpu, mem) in [
        ("s", 10, 120, "100m", "128Mi"),
        ("m", 8, 100, "250m", "256Mi"),
        ("l", 4, 100, "500m", "512Mi"),
        ("xl", 3, 50, "1", "1Gi"),
    ] {
        for i in 0..count {
            busy.push(
                Workload::new(
                    Kind::Deployment,
                    format!("{prefix}-{i}"),
                    replicas,
                    cpu,
                    mem,
                )
                .pdb("10%"),
            );
        }
    }
    busy.push(
        Workload::new(Kind::Deployment, "spread", 40, "250m", "256Mi")
            .pdb("10%")
            .anti_affinity(),
    );
    let mut light: Vec<Workload> = (0..4)
        .map(|i| {
            Workload::new(Kind::Deployment, format!("light-{i}"), 100, "100m", "128Mi").pdb("10%")
        })
        .collect();
    light.push(Workload::new(Kind::BarePods, "pinned", 10, "100m", "128Mi"));
    Scenario {
        name: "large-200",
        description: "200 nodes (8 cpu), 140 busy (~62% cpu) and 60 lightly used; 3,000 pods: 25 Deployments of 100m to 1 cpu, a Deployment of 40 with required anti-affinity, 400 light pods and 10 bare pods that cannot move (on light nodes); PDBs maxUnavailable 10%; a DaemonSet on every node",
        nodes: 200,
        node_cpu: "8",
        node_memory: "32Gi",
        shapes: vec![],
        light_from: 140,
        daemonsets: vec![node_exporter()],
        busy,
        light,
        cap: CAP,
        settle: None,
    }
}

/// Scenario 4: tight holes. 50 nodes (4 cpu): 30 busy, each holding one large pod that leaves a
/// hole of exactly 800m (15 nodes) or 500m (15 nodes) beside the DaemonSet pod on Karpenter's
/// nodes (allocatable 3.9 cpu; 100m more on kwok nodes); 20 lightly used nodes holding 15 pods of
/// 800m and 15 of 500m, which fill those holes one way only (a 500m pod in a large hole strands
/// an 800m pod). The scheduler's own scoring (least allocated)
/// prefers the larger holes for the small pods, so removing all 20 light nodes without a Pending
/// pod takes placing each pod where the plan did.
pub fn tight_holes() -> Scenario {
    Scenario {
        name: "tight-holes",
        description: "50 nodes (4 cpu), 30 busy and 20 lightly used; each busy node holds one pod of 3 cpu (15 nodes) or 3.3 cpu (15 nodes) beside the DaemonSet's 100m, leaving holes of exactly 800m and 500m on Karpenter's nodes (allocatable 3.9 cpu; 900m and 600m on kwok nodes); the light nodes hold 15 pods of 800m and 15 of 500m, which fill those holes exactly and only one way; PDBs maxUnavailable 10%",
        nodes: 50,
        node_cpu: "4",
        node_memory: "16Gi",
        shapes: vec![],
        light_from: 30,
        daemonsets: vec![node_exporter()],
        busy: vec![
            Workload::new(Kind::Deployment, "fill-a", 15, "3000m", "1Gi").pdb("10%"),
            Workload::new(Kind::Deployment, "fill-b", 15, "3300m", "1Gi").pdb("10%"),
        ],
        light: vec![
            Workload::new(Kind::Deployment, "piece-800", 15, "800m", "128Mi").pdb("10%"),
            Workload::new(Kind::Deployment, "piece-500", 15, "500m", "128Mi").pdb("10%"),
        ],
        cap: CAP,
        settle: None,
    }
}

/// Scenario 5: a heterogeneous GPU pool, priced. 16 GPU nodes of three sizes (3 × 8 GPUs at
/// 24/h, 5 × 4 GPUs at 10/h, 8 × 2 GPUs at 4/h: the bigger, the dearer per GPU) and 12 CPU nodes
/// (32 cpu at 1.6/h). On the GPU nodes: a training job of 8 GPUs (its node's GPUs all in use, its
/// cpu idle), 2 of 4 GPUs and 4 of 2 GPUs; 36 inference pods of 1 GPU, then scaled to 18 (the
/// ReplicaSet controller leaves them spread, as finished jobs do); 10 CPU-only pods of 12 cpu
/// that landed on GPU nodes while the CPU nodes were full (cordoned here). Then a web tier of 48
/// pods of 3 cpu, mostly on the CPU nodes. PDBs: 1 unavailable per training job, 10% for the
/// rest; a DaemonSet everywhere. Freeing GPU nodes takes moving the CPU-only pods to CPU nodes;
/// prices tell which GPU nodes save the most.
pub fn gpu_pool() -> Scenario {
    let shapes = vec![
        Shape {
            name: "gpu-8x",
            count: 3,
            cpu: "64",
            memory: "512Gi",
            gpus: 8,
            per_hour: 24.0,
        },
        Shape {
            name: "gpu-4x",
            count: 5,
            cpu: "32",
            memory: "256Gi",
            gpus: 4,
            per_hour: 10.0,
        },
        Shape {
            name: "gpu-2x",
            count: 8,
            cpu: "16",
            memory: "128Gi",
            gpus: 2,
            per_hour: 4.0,
        },
        Shape {
            name: "cpu-32x",
            count: 12,
            cpu: "32",
            memory: "128Gi",
            gpus: 0,
            per_hour: 1.6,
        },
    ];
    let nodes = shapes.iter().map(|s| s.count).sum();
    Scenario {
        name: "gpu-pool",
        description: "28 nodes, priced per hour: 3 with 8 GPUs (64 cpu, 24/h), 5 with 4 GPUs (32 cpu, 10/h), 8 with 2 GPUs (16 cpu, 4/h), 12 CPU nodes (32 cpu, 1.6/h); 60 GPUs. On the GPU nodes: training pods of 8, 4 (x2) and 2 (x4) GPUs, 36 inference pods of 1 GPU scaled to 18 (left spread), 10 CPU-only pods of 12 cpu (placed while the CPU nodes were cordoned); then 48 web pods of 3 cpu, mostly on the CPU nodes; PDBs maxUnavailable 1 per training job and 10% otherwise; a DaemonSet on every node. ebb's policy names the prices by instance type; Cluster Autoscaler has one node group per shape and its GPU label",
        nodes,
        node_cpu: "32",
        node_memory: "128Gi",
        light_from: nodes - 12,
        shapes,
        daemonsets: vec![node_exporter()],
        busy: vec![
            Workload::new(Kind::Deployment, "train-8", 1, "2", "32Gi")
                .gpus(8)
                .pdb("1"),
            Workload::new(Kind::Deployment, "train-4", 2, "2", "16Gi")
                .gpus(4)
                .pdb("1"),
            Workload::new(Kind::Deployment, "train-2", 4, "2", "16Gi")
                .gpus(2)
                .pdb("1"),
            Workload::new(Kind::Deployment, "infer", 36, "1", "8Gi")
                .gpus(1)
                .scale_to(18)
                .pdb("10%"),
            Workload::new(Kind::Deployment, "etl", 10, "12", "24Gi").pdb("10%"),
        ],
        light: vec![Workload::new(Kind::Deployment, "web", 48, "3", "4Gi").pdb("10%")],
        cap: CAP,
        settle: None,
    }
}

pub fn node_name(i: usize) -> String {
    format!("kwok-node-{i}")
}

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> anyhow::Result<T> {
    serde_json::from_value(v).context("a well-formed object")
}

/// A kwok node both scalers accept: ebb selects it by [`GROUP_LABEL`]; Cluster Autoscaler's
/// kwok provider needs the `kwok:` providerID (it matches its node group's instances by it), the
/// `kwok.x-k8s.io/node: fake` annotation (it deletes only such nodes) and its node-group name
/// annotation, and reads the group's minimum size, `min_count`, from its min-count annotation.
/// ebb reads none of these. A node of a [`Shape`] is named by it (its [`SHAPE_LABEL`], instance
/// type and node group) and has its GPUs (with the [`GPU_TYPE_LABEL`] Cluster Autoscaler reads).
pub fn node_object(
    name: &str,
    cpu: &str,
    memory: &str,
    shape: Option<&Shape>,
    min_count: i32,
) -> Value {
    let group = shape.map_or(GROUP, |s| s.name);
    let mut capacity = json!({"cpu": cpu, "memory": memory, "pods": "110"});
    let mut labels = json!({"type": "kwok", "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", GROUP_LABEL: GROUP,
        SHAPE_LABEL: group});
    if let Some(s) = shape {
        capacity = json!({"cpu": s.cpu, "memory": s.memory, "pods": "110"});
        labels[INSTANCE_TYPE_LABEL] = json!(s.name);
        if s.gpus > 0 {
            capacity[GPU_RESOURCE] = json!(s.gpus.to_string());
            labels[GPU_TYPE_LABEL] = json!(GPU_TYPE);
        }
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0",
                "cluster-autoscaler.kwok.nodegroup/name": group,
                MIN_COUNT_ANNOTATION: min_count.to_string()},
            "labels": labels},
        "spec": {"providerID": format!("kwok:{name}")},
        "status": {"capacity": capacity, "allocatable": capacity,
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"}}
    })
}

fn pod_spec(w: &Workload) -> Value {
    let mut resources = json!({"requests": {"cpu": w.cpu, "memory": w.memory}});
    if w.gpus > 0 {
        // Extended resources are requested and limited alike.
        resources["requests"][GPU_RESOURCE] = json!(w.gpus.to_string());
        resources["limits"] = json!({GPU_RESOURCE: w.gpus.to_string()});
    }
    let mut spec = json!({
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "containers": [{"name": "app", "image": "app", "resources": resources}]
    });
    if w.anti_affinity {
        spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": w.name}}}]}});
    }
    spec
}

async fn create_workload(client: &kube::Client, w: &Workload) -> anyhow::Result<()> {
    let pp = PostParams::default();
    let labels = json!({"app": w.name});
    let template = json!({"metadata": {"labels": labels}, "spec": pod_spec(w)});
    let meta = json!({"name": w.name, "namespace": NAMESPACE});
    match w.kind {
        Kind::Deployment => {
            Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
                .create(
                    &pp,
                    &obj(json!({"metadata": meta, "spec": {"replicas": w.replicas,
                    "selector": {"matchLabels": labels}, "template": template}}))?,
                )
                .await?;
        }
        Kind::StatefulSet => {
            Api::<StatefulSet>::namespaced(client.clone(), NAMESPACE)
                .create(
                    &pp,
                    &obj(json!({"metadata": meta, "spec": {"replicas": w.replicas,
                    "serviceName": w.name, "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": labels}, "template": template}}))?,
                )
                .await?;
        }
        Kind::DaemonSet => {
            Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
                .create(
                    &pp,
                    &obj(json!({"metadata": meta, "spec": {
                    "selector": {"matchLabels": labels}, "template": template}}))?,
                )
                .await?;
        }
        Kind::BarePods => {
            let api = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
            for i in 0..w.replicas {
                api.create(
                    &pp,
                    &obj(json!({"metadata": {"name": format!("{}-{i}", w.name),
                    "namespace": NAMESPACE, "labels": labels}, "spec": pod_spec(w)}))?,
                )
                .await?;
            }
        }
    }
    if let Some(mu) = w.max_unavailable {
        let max_unavailable: Value = match mu.parse::<i64>() {
            Ok(n) => json!(n),
            Err(_) => json!(mu),
        };
        Api::<PodDisruptionBudget>::namespaced(client.clone(), NAMESPACE)
            .create(
                &pp,
                &obj(
                    json!({"metadata": meta, "spec": {"maxUnavailable": max_unavailable,
                "selector": {"matchLabels": labels}}}),
                )?,
            )
            .await?;
    }
    Ok(())
}

/// Pods of the workload namespace that are Running and Ready.
pub async fn running_pods(client: &kube::Client) -> anyhow::Result<usize> {
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| ebb_e2e::setup::is_running(p))
        .count())
}

async fn wait_running(client: &kube::Client, want: usize, timeout: Duration) -> anyhow::Result<()> {
    let what = format!("{want} workload pods Running and Ready");
    wait_for(&what, timeout, || async {
        tokio::time::sleep(Duration::from_millis(950)).await;
        running_pods(client)
            .await
            .ok()
            .filter(|n| *n >= want)
            .map(|_| ())
    })
    .await
}

async fn set_unschedulable(
    client: &kube::Client,
    names: &[String],
    on: bool,
) -> anyhow::Result<()> {
    let api = Api::<Node>::all(client.clone());
    for n in names {
        api.patch(
            n,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": on}})),
        )
        .await
        .with_context(|| format!("cannot (un)cordon {n}"))?;
    }
    Ok(())
}

/// Ready nodes among `names`.
async fn ready_nodes(client: &kube::Client) -> anyhow::Result<usize> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(nodes
        .items
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count())
}

/// Creates the scenario's nodes ([`node_object`], Cluster Autoscaler's node group at least
/// `min_count` nodes) and workload on an empty cluster and waits until every pod runs and every
/// PodDisruptionBudget has its status; returns the budgets as the observer judges them.
pub async fn build(
    client: &kube::Client,
    s: &Scenario,
    min_count: i32,
) -> anyhow::Result<Vec<Budget>> {
    let names: Vec<String> = (0..s.nodes).map(node_name).collect();
    let nodes = Api::<Node>::all(client.clone());
    for (i, n) in names.iter().enumerate() {
        nodes
            .create(
                &PostParams::default(),
                &obj(node_object(
                    n,
                    s.node_cpu,
                    s.node_memory,
                    s.shape_of(i),
                    min_count,
                ))?,
            )
            .await
            .with_context(|| format!("cannot create node {n}"))?;
    }
    wait_for(
        &format!("{} kwok nodes Ready", s.nodes),
        Duration::from_secs(180),
        || async {
            tokio::time::sleep(Duration::from_millis(450)).await;
            ready_nodes(client)
                .await
                .ok()
                .filter(|n| *n >= s.nodes)
                .map(|_| ())
        },
    )
    .await?;
    build_on(client, s, &names).await
}

/// Puts the scenario's workload on `names`, `s.nodes` Ready nodes of the cluster (the first
/// `s.light_from` get the busy workloads, the rest the light ones), and waits until every pod
/// runs and every PodDisruptionBudget has its status; returns the budgets as the observer judges
/// them.
pub async fn build_on(
    client: &kube::Client,
    s: &Scenario,
    names: &[String],
) -> anyhow::Result<Vec<Budget>> {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await?;
    let light_nodes = &names[s.light_from.min(names.len())..];
    set_unschedulable(client, light_nodes, true).await?;
    // Workloads of whole GPUs are placed one at a time, largest first as listed, so that a pod of
    // 8 GPUs finds a node whose 8 are free.
    let mut placed = s.daemonsets.len() * s.nodes;
    for w in s.daemonsets.iter().chain(&s.busy) {
        create_workload(client, w).await?;
        if w.gpus > 0 {
            placed += w.replicas;
            wait_running(client, placed, Duration::from_secs(300)).await?;
        }
    }
    let busy_pods = s.daemonsets.len() * s.nodes + s.busy.iter().map(|w| w.replicas).sum::<usize>();
    wait_running(client, busy_pods, Duration::from_secs(900)).await?;
    for w in s.busy.iter().filter(|w| w.scale_to.is_some()) {
        scale(client, w).await?;
    }
    set_unschedulable(client, light_nodes, false).await?;
    for w in &s.light {
        create_workload(client, w).await?;
    }
    wait_running(client, s.pods(), Duration::from_secs(600)).await?;
    // Every budget's status from the disruption controller, counting all of its pods.
    let mut budgets = Vec::new();
    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), NAMESPACE);
    for w in s.workloads().filter(|w| w.max_unavailable.is_some()) {
        let want = i32::try_from(w.final_replicas()).unwrap_or(i32::MAX);
        let desired = wait_for(
            &format!("PDB {} status", w.name),
            Duration::from_secs(120),
            || async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let st = pdbs.get(&w.name).await.ok()?.status?;
                (st.expected_pods == want && st.current_healthy == want)
                    .then_some(st.desired_healthy)
            },
        )
        .await?;
        budgets.push(Budget {
            namespace: NAMESPACE.into(),
            name: w.name.clone(),
            match_labels: [("app".to_string(), w.name.clone())].into(),
            desired_healthy: desired,
        });
    }
    Ok(budgets)
}

/// Scales Deployment `w` to its [`Workload::scale_to`] and waits until its other pods are gone.
async fn scale(client: &kube::Client, w: &Workload) -> anyhow::Result<()> {
    let to = w.final_replicas();
    Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .patch(
            &w.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": to}})),
        )
        .await
        .with_context(|| format!("cannot scale {} to {to}", w.name))?;
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let selector = format!("app={}", w.name);
    wait_for(
        &format!("{} scaled to {to}", w.name),
        Duration::from_secs(120),
        || async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let n = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?
                .items
                .len();
            (n == to).then_some(())
        },
    )
    .await
}

/// Pods the workload should run now but does not (after the run): replicas of each Deployment
/// and StatefulSet not Ready, DaemonSet pods missing on the remaining nodes, bare pods gone.
pub async fn missing_pods(client: &kube::Client, s: &Scenario) -> anyhow::Result<usize> {
    Ok(missing_by_workload(client, s)
        .await?
        .iter()
        .map(|(_, n)| n)
        .sum())
}

/// [`missing_pods`] by workload, only those with any missing.
pub async fn missing_by_workload(
    client: &kube::Client,
    s: &Scenario,
) -> anyhow::Result<Vec<(String, usize)>> {
    let mut out = Vec::new();
    for w in s.workloads() {
        let missing = match w.kind {
            Kind::Deployment => {
                let d = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
                    .get(&w.name)
                    .await?;
                let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
                w.final_replicas()
                    .saturating_sub(usize::try_from(ready).unwrap_or(0))
            }
            Kind::StatefulSet => {
                let d = Api::<StatefulSet>::namespaced(client.clone(), NAMESPACE)
                    .get(&w.name)
                    .await?;
                let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
                w.replicas
                    .saturating_sub(usize::try_from(ready).unwrap_or(0))
            }
            Kind::DaemonSet => {
                let d = Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
                    .get(&w.name)
                    .await?;
                let st = d.status.unwrap_or_default();
                usize::try_from((st.desired_number_scheduled - st.number_ready).max(0)).unwrap_or(0)
            }
            Kind::BarePods => {
                let api = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
                let mut gone = 0;
                for i in 0..w.replicas {
                    if api.get_opt(&format!("{}-{i}", w.name)).await?.is_none() {
                        gone += 1;
                    }
                }
                gone
            }
        };
        if missing > 0 {
            out.push((w.name.clone(), missing));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_pool_adds_up() {
        let s = gpu_pool();
        assert_eq!(s.shapes.iter().map(|sh| sh.count).sum::<usize>(), s.nodes);
        let gpu_nodes: usize = s
            .shapes
            .iter()
            .filter(|sh| sh.gpus > 0)
            .map(|sh| sh.count)
            .sum();
        // The GPU nodes come first and take the busy workloads.
        assert_eq!(s.light_from, gpu_nodes);
        assert!(s.shapes[..3].iter().all(|sh| sh.gpus > 0));
        // The GPU workloads as created fill every GPU exactly (then some are scaled away).
        let gpus: u64 = s
            .shapes
            .iter()
            .map(|sh| u64::from(sh.gpus) * sh.count as u64)
            .sum();
        let asked: u64 = s
            .busy
            .iter()
            .map(|w| u64::from(w.gpus) * w.replicas as u64)
            .sum();
        assert_eq!(asked, gpus);
        // Larger GPU pods are placed before smaller ones.
        let sizes: Vec<u32> = s.busy.iter().map(|w| w.gpus).filter(|g| *g > 0).collect();
        assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
        // The bigger GPU nodes cost more per GPU.
        let per_gpu: Vec<f64> = s.shapes[..3]
            .iter()
            .map(|sh| sh.per_hour / f64::from(sh.gpus))
            .collect();
        assert!(per_gpu.windows(2).all(|w| w[0] > w[1]), "{per_gpu:?}");
        assert_eq!(
            s.pods(),
            s.nodes + 1 + 2 + 4 + 18 + 10 + 48,
            "pods once set up count the scaled replicas"
        );
    }

    #[test]
    fn nodes_of_a_shape_carry_its_type_gpus_and_group() {
        let s = gpu_pool();
        assert_eq!(s.shape_of(0).map(|sh| sh.name), Some("gpu-8x"));
        assert_eq!(s.shape_of(3).map(|sh| sh.name), Some("gpu-4x"));
        assert_eq!(s.shape_of(s.nodes - 1).map(|sh| sh.name), Some("cpu-32x"));
        assert!(s.shape_of(s.nodes).is_none());
        let n = node_object("n0", s.node_cpu, s.node_memory, s.shape_of(0), 0);
        assert_eq!(n["status"]["allocatable"][GPU_RESOURCE], "8");
        assert_eq!(n["status"]["allocatable"]["cpu"], "64");
        assert_eq!(n["metadata"]["labels"][INSTANCE_TYPE_LABEL], "gpu-8x");
        assert_eq!(n["metadata"]["labels"][GPU_TYPE_LABEL], GPU_TYPE);
        assert_eq!(n["metadata"]["labels"][SHAPE_LABEL], "gpu-8x");
        assert_eq!(
            n["metadata"]["annotations"]["cluster-autoscaler.kwok.nodegroup/name"],
            "gpu-8x"
        );
        let cpu = node_object("n1", s.node_cpu, s.node_memory, s.shape_of(s.nodes - 1), 0);
        assert!(cpu["status"]["allocatable"].get(GPU_RESOURCE).is_none());
        assert!(cpu["metadata"]["labels"].get(GPU_TYPE_LABEL).is_none());
        // A uniform scenario's node: one group, no instance type of the bench's.
        let u = node_object("n2", "4", "16Gi", None, 0);
        assert_eq!(u["metadata"]["labels"][SHAPE_LABEL], GROUP);
        assert!(u["metadata"]["labels"].get(INSTANCE_TYPE_LABEL).is_none());
    }

    #[test]
    fn gpu_pods_request_and_limit_whole_gpus() {
        let w = Workload::new(Kind::Deployment, "t", 1, "2", "1Gi").gpus(4);
        let spec = pod_spec(&w);
        let r = &spec["containers"][0]["resources"];
        assert_eq!(r["requests"][GPU_RESOURCE], "4");
        assert_eq!(r["limits"][GPU_RESOURCE], "4");
        let plain = pod_spec(&Workload::new(Kind::Deployment, "p", 1, "2", "1Gi"));
        assert!(plain["containers"][0]["resources"].get("limits").is_none());
    }
}
