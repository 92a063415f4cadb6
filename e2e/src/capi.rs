//! Cluster API on the real control plane: its CRDs from its Go module, node groups of Machines
//! bound to kwok nodes, and (where it builds) its core controllers.
//!
//! `e2e/k8s/build.sh capi` copies the CRDs of `sigs.k8s.io/cluster-api` ([`CAPI_VERSION`]) into
//! the cache; [`install_crds`] applies them with two CRDs of our own for a fake infrastructure
//! provider ([`INFRA_GROUP`]: `KwokMachine`, `KwokMachineTemplate`, labelled with the Cluster API
//! contract they follow). [`machine_deployment`] then builds what Cluster API would have made
//! of a MachineDeployment whose Machines became the given kwok nodes: Cluster, MachineDeployment,
//! MachineSet, Machines (with `status.nodeRef`), KwokMachines (with their provider IDs) and the
//! annotations the Machine controller puts on each Node. Without [`CoreManager`] nothing acts on
//! them; with it, Cluster API's own controllers (`sigs.k8s.io/cluster-api/core`, built by
//! `build.sh capi manager`) reconcile them: a MachineDeployment scaled down scales its
//! MachineSet, which deletes its Machines (those annotated [`DELETE_MACHINE_ANNOTATION`] first),
//! and the Machine controller drains and deletes their Nodes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use crate::harness::{ChildProcess, TestEnv, free_port, wait_for};

/// The Cluster API release whose CRDs and core manager the tests use (pinned in `build.sh`).
pub const CAPI_VERSION: &str = "v1.14.2";
/// Cluster API's core API group.
pub const GROUP: &str = "cluster.x-k8s.io";
/// The version the objects are written in: the CRDs' storage version (`v1beta1` is also served,
/// deprecated; the base CRDs name no conversion webhook, so the API server converts between the
/// two by rewriting `apiVersion` only).
pub const VERSION: &str = "v1beta2";
/// The fake infrastructure provider's API group (CRDs of our own, see [`infra_crds`]).
pub const INFRA_GROUP: &str = "infrastructure.e2e.ebb.dev";
/// The fake infrastructure provider's API version.
pub const INFRA_VERSION: &str = "v1alpha1";
/// The Cluster every [`machine_deployment`] belongs to (one per namespace).
pub const CLUSTER: &str = "ebb-e2e";

/// Label of every Cluster API object of a cluster: the Cluster's name.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Label of a MachineDeployment's MachineSets and Machines: its name.
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
/// Label of a MachineSet's Machines: its name.
pub const SET_NAME_LABEL: &str = "cluster.x-k8s.io/set-name";
/// Label telling a MachineDeployment's MachineSets (and their Machines) apart.
pub const TEMPLATE_HASH_LABEL: &str = "machine-template-hash";
/// Label of a control-plane Machine.
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// Machine annotation: delete this Machine first when its MachineSet scales down.
pub const DELETE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/delete-machine";
/// MachineDeployment annotation: the node group's minimum size (the cluster-autoscaler's).
pub const MIN_SIZE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
/// Node annotation: the Machine the Node is.
pub const NODE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/machine";
/// Node annotation: the Machine's namespace.
pub const NODE_CLUSTER_NAMESPACE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-namespace";
/// Node annotation: the Machine's Cluster.
pub const NODE_CLUSTER_NAME_ANNOTATION: &str = "cluster.x-k8s.io/cluster-name";
/// Node annotation: the kind of the Machine's owner (`MachineSet`).
pub const NODE_OWNER_KIND_ANNOTATION: &str = "cluster.x-k8s.io/owner-kind";
/// Node annotation: the name of the Machine's owner.
pub const NODE_OWNER_NAME_ANNOTATION: &str = "cluster.x-k8s.io/owner-name";

/// The value of [`TEMPLATE_HASH_LABEL`] on the MachineSets [`machine_deployment`] makes.
const TEMPLATE_HASH: &str = "e2e";
/// Field manager of every write here.
const MANAGER: &str = "ebb-e2e";

/// The kinds this harness writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Cluster,
    MachineDeployment,
    MachineSet,
    Machine,
    /// The fake infrastructure provider's machine.
    KwokMachine,
    /// The fake infrastructure provider's machine template.
    KwokMachineTemplate,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Cluster => "Cluster",
            Kind::MachineDeployment => "MachineDeployment",
            Kind::MachineSet => "MachineSet",
            Kind::Machine => "Machine",
            Kind::KwokMachine => "KwokMachine",
            Kind::KwokMachineTemplate => "KwokMachineTemplate",
        }
    }

    /// `group/version`.
    pub fn api_version(self) -> String {
        match self {
            Kind::KwokMachine | Kind::KwokMachineTemplate => {
                format!("{INFRA_GROUP}/{INFRA_VERSION}")
            }
            _ => format!("{GROUP}/{VERSION}"),
        }
    }

    pub fn resource(self) -> ApiResource {
        let (group, version) = match self {
            Kind::KwokMachine | Kind::KwokMachineTemplate => (INFRA_GROUP, INFRA_VERSION),
            _ => (GROUP, VERSION),
        };
        let plural = format!("{}s", self.name().to_ascii_lowercase());
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, self.name()),
            &plural,
        )
    }
}

/// The API of `kind` in namespace `ns`.
pub fn api(client: &kube::Client, ns: &str, kind: Kind) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &kind.resource())
}

// ---- CRDs --------------------------------------------------------------------------------

/// One `build.sh capi` at a time in this process (tests run on parallel threads).
static CAPI_BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("k8s")
        .join("build.sh")
}

/// Runs `build.sh capi ARGS...` (serialised), returning the cache directory it prints
/// (`.../<k8s version>`); fails with the script's last lines.
fn run_build(args: &[&str]) -> anyhow::Result<PathBuf> {
    let _one = CAPI_BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let script = build_script();
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("capi")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let lines: Vec<&str> = stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        bail!(
            "{} capi {} failed ({}): it needs Go 1.26+ and the Go module proxy \
             (sigs.k8s.io/cluster-api@{CAPI_VERSION}); see e2e/k8s/README.md:\n{tail}",
            script.display(),
            args.join(" "),
            out.status
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| PathBuf::from(l.trim()))
        .context("build.sh capi printed no cache directory")?;
    Ok(dir)
}

/// The directory `build.sh capi` copies Cluster API's CRDs into, building it when missing or
/// stale (no network when current).
pub async fn crd_dir() -> anyhow::Result<PathBuf> {
    let out = tokio::task::spawn_blocking(|| run_build(&[]))
        .await
        .context("the build task panicked")??;
    Ok(out.join("cluster-api-crds"))
}

/// The fake infrastructure provider's CRDs: `KwokMachine` (spec and status free-form, status
/// subresource) and `KwokMachineTemplate`, labelled `cluster.x-k8s.io/v1beta2: v1alpha1` (the
/// contract label Cluster API reads to pick the version of a referenced kind).
pub fn infra_crds() -> Vec<Value> {
    let crd = |kind: &str, status: bool| {
        let plural = format!("{}s", kind.to_ascii_lowercase());
        let mut props =
            json!({"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}});
        let mut subresources = json!({});
        if status {
            props["status"] =
                json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
            subresources = json!({"status": {}});
        }
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{INFRA_GROUP}"),
                "labels": {format!("{GROUP}/{VERSION}"): INFRA_VERSION}},
            "spec": {"group": INFRA_GROUP, "scope": "Namespaced",
                "names": {"kind": kind, "listKind": format!("{kind}List"), "plural": plural,
                    "singular": kind.to_ascii_lowercase()},
                "versions": [{"name": INFRA_VERSION, "served": true, "storage": true,
                    "subresources": subresources,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": props}}}]}
        })
    };
    vec![crd("KwokMachine", true), crd("KwokMachineTemplate", false)]
}

/// Builds (when needed, see [`crd_dir`]) and applies Cluster API's CRDs and the fake
/// infrastructure provider's ([`infra_crds`]), server-side, and waits until all are Established.
/// For a real cluster; fails on a simulator.
pub async fn install_crds(env: &TestEnv) -> anyhow::Result<()> {
    if env.sim().is_some() {
        bail!("Cluster API's CRDs are for a real control plane, not ebb-sim");
    }
    let dir = crd_dir().await?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no CRDs in {}: run e2e/k8s/build.sh capi", dir.display());
    }
    let mut crds = Vec::new();
    for f in &files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let crd: Value =
            serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", f.display()))?;
        crds.push(crd);
    }
    crds.extend(infra_crds());
    let api = Api::<CustomResourceDefinition>::all(env.client.clone());
    let mut names = Vec::new();
    for crd in &crds {
        let name = crd["metadata"]["name"]
            .as_str()
            .context("a CRD without metadata.name")?
            .to_string();
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(crd),
        )
        .await
        .with_context(|| format!("applying CRD {name}"))?;
        names.push(name);
    }
    for name in &names {
        wait_for(
            &format!("CRD {name} established"),
            Duration::from_secs(30),
            || async {
                let crd = api.get_opt(name).await.ok()??;
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

// ---- objects -----------------------------------------------------------------------------

/// What [`machine_deployment`] created.
#[derive(Clone, Debug)]
pub struct MachineDeploymentRefs {
    pub namespace: String,
    /// The Cluster ([`CLUSTER`]).
    pub cluster: String,
    pub deployment: String,
    pub machine_set: String,
    /// One per node, in the order of the nodes given.
    pub machines: Vec<MachineRef>,
}

/// A Machine and the Node it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineRef {
    pub name: String,
    pub node: String,
}

impl MachineDeploymentRefs {
    /// The Machine that is `node`.
    pub fn machine_of(&self, node: &str) -> Option<&str> {
        self.machines
            .iter()
            .find(|m| m.node == node)
            .map(|m| m.name.as_str())
    }
}

fn owner_ref(obj: &DynamicObject, kind: Kind, controller: bool) -> anyhow::Result<Value> {
    let name = obj
        .metadata
        .name
        .clone()
        .context("an object without a name")?;
    let uid = obj
        .metadata
        .uid
        .clone()
        .context("an object without a uid")?;
    Ok(
        json!({"apiVersion": kind.api_version(), "kind": kind.name(), "name": name, "uid": uid,
        "controller": controller, "blockOwnerDeletion": true}),
    )
}

async fn create(
    client: &kube::Client,
    ns: &str,
    kind: Kind,
    mut obj: Value,
) -> anyhow::Result<DynamicObject> {
    obj["apiVersion"] = json!(kind.api_version());
    obj["kind"] = json!(kind.name());
    obj["metadata"]["namespace"] = json!(ns);
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let o: DynamicObject = serde_json::from_value(obj)?;
    api(client, ns, kind)
        .create(&PostParams::default(), &o)
        .await
        .with_context(|| format!("creating {} {ns}/{name}", kind.name()))
}

async fn patch_status(
    client: &kube::Client,
    ns: &str,
    kind: Kind,
    name: &str,
    status: Value,
) -> anyhow::Result<()> {
    api(client, ns, kind)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .with_context(|| format!("writing the status of {} {ns}/{name}", kind.name()))?;
    Ok(())
}

/// The Cluster [`CLUSTER`] in `ns`, created when missing: no infrastructure or control-plane
/// reference (Cluster API then counts its infrastructure as provisioned).
pub async fn ensure_cluster(client: &kube::Client, ns: &str) -> anyhow::Result<DynamicObject> {
    let clusters = api(client, ns, Kind::Cluster);
    if let Some(c) = clusters.get_opt(CLUSTER).await? {
        return Ok(c);
    }
    // The schema wants a non-empty spec.
    let cluster = json!({"metadata": {"name": CLUSTER},
        "spec": {"clusterNetwork": {"serviceDomain": "cluster.local"}}});
    match create(client, ns, Kind::Cluster, cluster).await {
        Ok(c) => Ok(c),
        // Created meanwhile by a concurrent caller.
        Err(e) if is_conflict(&e) => Ok(clusters.get(CLUSTER).await?),
        Err(e) => Err(e),
    }
}

fn is_conflict(e: &anyhow::Error) -> bool {
    e.chain().any(
        |c| matches!(c.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 409),
    )
}

/// The Machine spec of the node group `name`: no bootstrap provider (a data secret name, so
/// bootstrap counts as done), infrastructure from `infra`.
fn machine_spec(infra_kind: Kind, infra_name: &str, bootstrap: &str) -> Value {
    json!({
        "clusterName": CLUSTER,
        "bootstrap": {"dataSecretName": bootstrap},
        "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": infra_kind.name(), "name": infra_name},
        "deletion": {"nodeDeletionTimeoutSeconds": 10},
    })
}

/// Creates in `ns` what Cluster API would have made of a MachineDeployment `name` whose Machines
/// became `nodes` (existing Nodes, with provider IDs): the Cluster [`CLUSTER`] if missing; a
/// KwokMachineTemplate `name`; the MachineDeployment `name` with `replicas = nodes.len()`
/// (owned by the Cluster; [`MIN_SIZE_ANNOTATION`] when `min_size` is given); its MachineSet
/// `<name>-e2e` (controller owner reference, labels [`DEPLOYMENT_NAME_LABEL`],
/// [`CLUSTER_NAME_LABEL`], [`TEMPLATE_HASH_LABEL`]); per node a KwokMachine and a Machine
/// `<name>-e2e-<i>` owned by the MachineSet (labels as the MachineSet's plus [`SET_NAME_LABEL`];
/// `spec.providerID` the Node's, `status.nodeRef` the Node, phase Running); the status
/// replica counts of the MachineDeployment and MachineSet; and each Node annotated as Cluster
/// API's Machine controller does ([`NODE_MACHINE_ANNOTATION`] and the others).
pub async fn machine_deployment(
    client: &kube::Client,
    ns: &str,
    name: &str,
    nodes: &[String],
    min_size: Option<i32>,
) -> anyhow::Result<MachineDeploymentRefs> {
    let cluster = ensure_cluster(client, ns).await?;
    let replicas = i64::try_from(nodes.len()).context("too many nodes")?;
    let bootstrap = format!("{name}-bootstrap");

    create(
        client,
        ns,
        Kind::KwokMachineTemplate,
        json!({"metadata": {"name": name}, "spec": {"template": {"spec": {}}}}),
    )
    .await?;

    let md_labels = json!({CLUSTER_NAME_LABEL: CLUSTER, DEPLOYMENT_NAME_LABEL: name});
    let template_spec = machine_spec(Kind::KwokMachineTemplate, name, &bootstrap);
    let mut annotations = serde_json::Map::new();
    if let Some(min) = min_size {
        annotations.insert(MIN_SIZE_ANNOTATION.into(), json!(min.to_string()));
    }
    let md = create(
        client,
        ns,
        Kind::MachineDeployment,
        json!({
            "metadata": {"name": name, "labels": {CLUSTER_NAME_LABEL: CLUSTER},
                "annotations": annotations,
                "ownerReferences": [owner_ref(&cluster, Kind::Cluster, false)?]},
            "spec": {
                "clusterName": CLUSTER,
                "replicas": replicas,
                "selector": {"matchLabels": md_labels},
                "template": {"metadata": {"labels": md_labels}, "spec": template_spec},
                // What Cluster API's defaulting webhook (not installed) would set.
                "rollout": {"strategy": {"type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}},
                "deletion": {"order": "Random"},
            },
        }),
    )
    .await?;

    let ms_name = format!("{name}-{TEMPLATE_HASH}");
    let ms_labels = json!({CLUSTER_NAME_LABEL: CLUSTER, DEPLOYMENT_NAME_LABEL: name,
        TEMPLATE_HASH_LABEL: TEMPLATE_HASH});
    let ms = create(
        client,
        ns,
        Kind::MachineSet,
        json!({
            "metadata": {"name": ms_name, "labels": ms_labels,
                "annotations": {"machinedeployment.clusters.x-k8s.io/revision": "1"},
                "ownerReferences": [owner_ref(&md, Kind::MachineDeployment, true)?]},
            "spec": {
                "clusterName": CLUSTER,
                "replicas": replicas,
                "selector": {"matchLabels": ms_labels},
                "template": {"metadata": {"labels": ms_labels}, "spec": template_spec},
                "deletion": {"order": "Random"},
            },
        }),
    )
    .await?;

    let mut machine_labels = ms_labels.clone();
    machine_labels[SET_NAME_LABEL] = json!(ms_name);
    let node_api: Api<Node> = Api::all(client.clone());
    let mut machines = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let n = node_api
            .get(node)
            .await
            .with_context(|| format!("reading node {node}"))?;
        let provider_id = n
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .with_context(|| format!("node {node} has no spec.providerID"))?;
        let machine = format!("{ms_name}-{i}");
        create(
            client,
            ns,
            Kind::KwokMachine,
            json!({"metadata": {"name": machine}, "spec": {"providerID": provider_id}}),
        )
        .await?;
        patch_status(
            client,
            ns,
            Kind::KwokMachine,
            &machine,
            json!({"initialization": {"provisioned": true}}),
        )
        .await?;
        let mut spec = machine_spec(Kind::KwokMachine, &machine, &bootstrap);
        spec["providerID"] = json!(provider_id);
        create(
            client,
            ns,
            Kind::Machine,
            json!({
                "metadata": {"name": machine, "labels": machine_labels,
                    "ownerReferences": [owner_ref(&ms, Kind::MachineSet, true)?]},
                "spec": spec,
            }),
        )
        .await?;
        patch_status(
            client,
            ns,
            Kind::Machine,
            &machine,
            json!({"nodeRef": {"name": node}, "phase": "Running"}),
        )
        .await?;
        node_api
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    NODE_MACHINE_ANNOTATION: machine,
                    NODE_CLUSTER_NAMESPACE_ANNOTATION: ns,
                    NODE_CLUSTER_NAME_ANNOTATION: CLUSTER,
                    NODE_OWNER_KIND_ANNOTATION: "MachineSet",
                    NODE_OWNER_NAME_ANNOTATION: ms_name,
                }}})),
            )
            .await
            .with_context(|| format!("annotating node {node}"))?;
        machines.push(MachineRef {
            name: machine,
            node: node.clone(),
        });
    }

    let counts = |selector: &Value| {
        let sel = selector
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        json!({"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
            "upToDateReplicas": replicas, "selector": sel})
    };
    patch_status(
        client,
        ns,
        Kind::MachineDeployment,
        name,
        counts(&md_labels),
    )
    .await?;
    patch_status(client, ns, Kind::MachineSet, &ms_name, counts(&ms_labels)).await?;

    Ok(MachineDeploymentRefs {
        namespace: ns.to_string(),
        cluster: CLUSTER.to_string(),
        deployment: name.to_string(),
        machine_set: ms_name,
        machines,
    })
}

// ---- reading and changing ----------------------------------------------------------------

/// `spec.replicas` of the MachineDeployment or MachineSet `name` (`kind`).
pub async fn spec_replicas(
    client: &kube::Client,
    ns: &str,
    kind: Kind,
    name: &str,
) -> anyhow::Result<i64> {
    let o = api(client, ns, kind)
        .get(name)
        .await
        .with_context(|| format!("reading {} {ns}/{name}", kind.name()))?;
    o.data["spec"]["replicas"]
        .as_i64()
        .with_context(|| format!("{} {ns}/{name} has no spec.replicas", kind.name()))
}

/// `spec.replicas` of the MachineDeployment `name`.
pub async fn deployment_replicas(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<i64> {
    spec_replicas(client, ns, Kind::MachineDeployment, name).await
}

/// `spec.replicas` of the MachineSet `name`.
pub async fn machine_set_replicas(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<i64> {
    spec_replicas(client, ns, Kind::MachineSet, name).await
}

/// A Machine as read back.
#[derive(Clone, Debug, Default)]
pub struct MachineInfo {
    pub name: String,
    /// `status.nodeRef.name`.
    pub node: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The controlling owner, `Kind/name`.
    pub owner: Option<String>,
    /// It has a deletion timestamp (waiting for finalizers).
    pub deleting: bool,
}

/// Every Machine in `ns`, by name.
pub async fn machines(
    client: &kube::Client,
    ns: &str,
) -> anyhow::Result<BTreeMap<String, MachineInfo>> {
    let list = api(client, ns, Kind::Machine)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing Machines in {ns}"))?;
    Ok(list
        .items
        .into_iter()
        .map(|m| {
            let name = m.metadata.name.clone().unwrap_or_default();
            let info = MachineInfo {
                name: name.clone(),
                node: m.data["status"]["nodeRef"]["name"]
                    .as_str()
                    .map(str::to_string),
                labels: m.metadata.labels.clone().unwrap_or_default(),
                annotations: m.metadata.annotations.clone().unwrap_or_default(),
                owner: m
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|o| o.controller == Some(true))
                    .map(|o| format!("{}/{}", o.kind, o.name)),
                deleting: m.metadata.deletion_timestamp.is_some(),
            };
            (name, info)
        })
        .collect())
}

/// Sets annotation `key: value` on Machine `name`.
pub async fn annotate_machine(
    client: &kube::Client,
    ns: &str,
    name: &str,
    key: &str,
    value: &str,
) -> anyhow::Result<()> {
    api(client, ns, Kind::Machine)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .with_context(|| format!("annotating Machine {ns}/{name}"))?;
    Ok(())
}

// ---- Cluster API's core manager ----------------------------------------------------------

/// Cluster API's core manager (`sigs.k8s.io/cluster-api/core` at [`CAPI_VERSION`], built by
/// `build.sh capi manager`) running against the test's control plane as the admin, its output in
/// `<cluster dir>/capi-manager.log`; killed when dropped. Webhooks are served (the manager
/// insists) on a free port with a self-signed certificate, but no webhook configuration points
/// at them: objects are written as the defaulting webhooks would have left them.
pub struct CoreManager {
    pub child: ChildProcess,
    log: PathBuf,
}

impl CoreManager {
    /// Builds the manager when needed, prepares `ns` for it and starts it; returns once its
    /// controllers run and its cluster cache reaches the Cluster [`CLUSTER`]. In `ns`: the Cluster
    /// ([`ensure_cluster`]), its kubeconfig Secret `<cluster>-kubeconfig` (this control plane's
    /// admin kubeconfig: the "workload cluster" is the management cluster itself, where the
    /// kwok Nodes are), and a control-plane Machine `<cluster>-control-plane` without a Node
    /// (the Machine controller deletes the Node of a deleted Machine only when the Cluster has a
    /// control-plane Machine besides it). Needs the CRDs ([`install_crds`]) and a control plane
    /// the suite started (for its directory).
    pub async fn start(env: &TestEnv, ns: &str) -> anyhow::Result<Self> {
        let Some(real) = env.real() else {
            bail!(
                "Cluster API's manager runs against a control plane the suite starts (its log goes \
                 to the control plane's directory); unset {}",
                crate::harness::REAL_CLUSTER_ENV
            );
        };
        let cache = tokio::task::spawn_blocking(|| run_build(&["manager"]))
            .await
            .context("the build task panicked")??;
        let bin = cache.join("bin").join("capi-manager");
        if !bin.is_file() {
            bail!("build.sh capi manager built no {}", bin.display());
        }

        let client = &env.client;
        ensure_cluster(client, ns).await?;
        let kubeconfig = std::fs::read_to_string(&env.kubeconfig)
            .with_context(|| format!("reading {}", env.kubeconfig.display()))?;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("{CLUSTER}-kubeconfig"), "namespace": ns,
                "labels": {CLUSTER_NAME_LABEL: CLUSTER}},
            "type": "cluster.x-k8s.io/secret",
            "stringData": {"value": kubeconfig},
        }))?;
        Api::<Secret>::namespaced(client.clone(), ns)
            .patch(
                &format!("{CLUSTER}-kubeconfig"),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await
            .context("writing the Cluster's kubeconfig Secret")?;
        let cp = format!("{CLUSTER}-control-plane");
        if api(client, ns, Kind::Machine).get_opt(&cp).await?.is_none() {
            create(
                client,
                ns,
                Kind::KwokMachine,
                json!({"metadata": {"name": cp}, "spec": {}}),
            )
            .await?;
            create(
                client,
                ns,
                Kind::Machine,
                json!({
                    "metadata": {"name": cp,
                        "labels": {CLUSTER_NAME_LABEL: CLUSTER, CONTROL_PLANE_LABEL: ""}},
                    "spec": machine_spec(Kind::KwokMachine, &cp, &cp),
                }),
            )
            .await?;
        }

        let certs = real.dir().join("capi-webhook-certs");
        make_certificate(&certs)?;
        let port = free_port()?;
        let log = real.dir().join("capi-manager.log");
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("duplicating the log file")?;
        let certs_arg = format!("--webhook-cert-dir={}", certs.display());
        let port_arg = format!("--webhook-port={port}");
        let child = tokio::process::Command::new(&bin)
            .args([
                port_arg.as_str(),
                certs_arg.as_str(),
                "--health-addr=127.0.0.1:0",
                "--diagnostics-address=127.0.0.1:0",
                "--insecure-diagnostics",
            ])
            .env("KUBECONFIG", &env.kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let mut manager = Self {
            child: ChildProcess {
                name: "capi-manager".into(),
                child,
            },
            log,
        };
        let cluster_key = format!("Cluster=\"{ns}/{CLUSTER}\"");
        let ready = wait_for(
            "Cluster API's manager running and connected to the cluster",
            Duration::from_secs(60),
            || {
                let state = if manager.alive() {
                    let text = manager.log_text();
                    let started = ["machineset", "machinedeployment", "machine"]
                        .iter()
                        .all(|c| {
                            text.contains(&format!("\"Starting workers\" controller=\"{c}\""))
                        });
                    let connected = text.lines().any(|l| {
                        l.contains("\"Connected\" controller=\"clustercache\"")
                            && l.contains(&cluster_key)
                    });
                    (started && connected).then_some(true)
                } else {
                    Some(false)
                };
                async move { state }
            },
        )
        .await;
        match ready {
            Ok(true) => Ok(manager),
            Ok(false) => bail!(
                "Cluster API's manager exited; the end of {}:\n{}",
                manager.log.display(),
                manager.log_tail(30)
            ),
            Err(e) => bail!(
                "{e}; the end of {}:\n{}",
                manager.log.display(),
                manager.log_tail(30)
            ),
        }
    }

    /// Where its output goes.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Its output so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of its output, without the flag dump and webhook registrations.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.contains("] \"FLAG: ") && !l.contains("Registering"))
            .collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.child.try_wait(), Ok(None))
    }
}

impl Drop for CoreManager {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- {} (last 40 lines) ----", self.log.display());
            eprintln!("{}", self.log_tail(40));
        }
    }
}

/// A self-signed certificate for the manager's webhook server (`tls.crt`, `tls.key` in `dir`).
fn make_certificate(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-keyout",
        ])
        .arg(dir.join("tls.key"))
        .arg("-out")
        .arg(dir.join("tls.crt"))
        .stdin(Stdio::null())
        .output()
        .context("cannot run openssl (needed for the Cluster API manager's webhook certificate)")?;
    if !out.status.success() {
        bail!(
            "openssl could not make a certificate: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
