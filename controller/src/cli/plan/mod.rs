//! `ebb-controller plan`: an offline, read-only what-if. Reads a snapshot file (or lists the
//! same objects from the current kubeconfig context), runs one planner loop and prints it.

pub mod input;
pub mod output;

use std::io::Write;

use anyhow::Context;
use jiff::Timestamp;

use crate::cli::{PlanArgs, PlanOutput};
use crate::cluster::{ClusterObjects, PredicateChecker, build_snapshot};
use crate::scaledown::{self, InstantStopwatch, PlannerConfig, PlannerState, select_deletions};

/// What one `plan` run produced.
#[derive(Debug)]
pub struct PlanReport {
    pub document: output::PlanOut,
    pub table: String,
}

/// Plans on `objects` with `spec` at `now`. Every candidate counts as unneeded long enough.
pub fn plan_objects(
    objects: &ClusterObjects,
    spec: &ebb_api::ScaleDownPolicySpec,
    now: Timestamp,
) -> anyhow::Result<PlanReport> {
    let cfg = PlannerConfig::from_spec(spec).context("the policy cannot be used")?;
    if let crate::scaledown::budgets::Budgets::Invalid(why) = &cfg.budgets {
        eprintln!("warning: {why}; every deletion is held (fail closed)");
    }
    let mut snap = build_snapshot(objects).context("the snapshot cannot be used")?;
    let mut state = PlannerState::default();
    let mut checker = PredicateChecker::new();
    let mut watch = InstantStopwatch::start();
    let plan = scaledown::plan(
        &mut snap,
        &mut checker,
        &cfg,
        now,
        &mut state,
        &Default::default(),
        &mut watch,
    );
    let sel = select_deletions(&snap, &plan, &state, &cfg, now, true);
    Ok(PlanReport {
        document: output::PlanOut::new(&plan, &sel),
        table: output::table(&plan, &sel),
    })
}

/// Lists the objects `plan` needs through `client` (read-only): every kind the running
/// controller watches for its model (a test holds the two to the same kinds).
pub async fn list_live(client: &kube::Client) -> anyhow::Result<ClusterObjects> {
    use crate::cluster::CachedPod;
    use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, StatefulSet};
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{
        Node, PersistentVolume, PersistentVolumeClaim, ReplicationController,
    };
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::storage::v1::StorageClass;
    use kube::api::{Api, ListParams};

    // Every object of a kind, in all namespaces for namespaced kinds.
    async fn all<K>(client: &kube::Client, what: &str) -> anyhow::Result<Vec<K>>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let list = Api::<K>::all(client.clone())
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing {what}"))?;
        eprintln!("listed {} {what}", list.items.len());
        Ok(list.items)
    }
    Ok(ClusterObjects {
        providers: list_providers(client).await?,
        nodes: all::<Node>(client, "nodes").await?,
        pods: all::<CachedPod>(client, "pods").await?,
        pdbs: all::<PodDisruptionBudget>(client, "poddisruptionbudgets").await?,
        replica_sets: all::<ReplicaSet>(client, "replicasets").await?,
        stateful_sets: all::<StatefulSet>(client, "statefulsets").await?,
        daemon_sets: all::<DaemonSet>(client, "daemonsets").await?,
        jobs: all::<Job>(client, "jobs").await?,
        replication_controllers: all::<ReplicationController>(client, "replicationcontrollers")
            .await?,
        persistent_volumes: all::<PersistentVolume>(client, "persistentvolumes").await?,
        persistent_volume_claims: all::<PersistentVolumeClaim>(client, "persistentvolumeclaims")
            .await?,
        storage_classes: all::<StorageClass>(client, "storageclasses").await?,
        // Optional: without node agents (or their CRD) nothing is warm.
        node_states: match all::<ebb_api::nodestate::NodeState>(client, "nodestates").await {
            Ok(v) => v,
            Err(e) => {
                eprintln!("warning: {e:#}; planning without warm-data tie-breaks");
                Vec::new()
            }
        },
    })
}

/// Cluster API's MachineSets and MachineDeployments and Karpenter's NodeClaims, where the API
/// server serves them (planning as a controller with both removals enabled would).
async fn list_providers(
    client: &kube::Client,
) -> anyhow::Result<crate::cluster::machines::ProviderIndex> {
    use crate::actuation::removal::{ClusterApiKinds, KarpenterKinds};
    use kube::api::{Api, DynamicObject, ListParams};
    let mut index = crate::cluster::machines::ProviderIndex::default();
    let list = |ar: &kube::api::ApiResource| {
        let api = Api::<DynamicObject>::all_with(client.clone(), ar);
        let what = ar.plural.clone();
        async move {
            let items = api
                .list(&ListParams::default())
                .await
                .with_context(|| format!("listing {what}"))?
                .items;
            eprintln!("listed {} {what}", items.len());
            anyhow::Ok(items)
        }
    };
    if let Ok(kinds) = ClusterApiKinds::discover(client).await {
        index.cluster_api = Some(Default::default());
        for o in list(&kinds.machine_set).await? {
            index.add_machine_set(&o);
        }
        for o in list(&kinds.machine_deployment).await? {
            index.add_machine_deployment(&o);
        }
    }
    if let Ok(kinds) = KarpenterKinds::discover(client).await {
        index.karpenter = Some(Default::default());
        for o in list(&kinds.node_claim).await? {
            index.add_node_claim(&o);
        }
    }
    Ok(index)
}

/// The `plan` subcommand.
pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let now = match &args.now {
        Some(s) => s.parse::<Timestamp>().with_context(|| {
            format!("--now `{s}` is not an RFC 3339 time such as 2026-01-31T12:00:00Z")
        })?,
        None => Timestamp::now(),
    };
    let spec = match &args.policy {
        Some(p) => input::read_policy(p)?,
        None => ebb_api::ScaleDownPolicySpec::default(),
    };
    let objects = match &args.snapshot {
        Some(path) => {
            let file = input::read_snapshot(path)?;
            for w in &file.warnings {
                eprintln!("warning: {w}");
            }
            file.objects
        }
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?
            .block_on(async {
                let client = kube::Client::try_default().await.context(
                    "connecting with the current kubeconfig context (use --snapshot to plan offline)",
                )?;
                list_live(&client).await
            })?,
    };
    eprintln!(
        "planning on {} nodes and {} pods",
        objects.nodes.len(),
        objects.pods.len()
    );
    let report = plan_objects(&objects, &spec, now)?;
    let text = match args.output {
        PlanOutput::Json => {
            let mut s =
                serde_json::to_string_pretty(&report.document).context("serializing the plan")?;
            s.push('\n');
            s
        }
        PlanOutput::Table => report.table,
    };
    std::io::stdout()
        .write_all(text.as_bytes())
        .context("writing to stdout")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{node, objects, pod};

    /// A policy with a price table, as a user writes it, through to both outputs.
    #[test]
    fn prices_in_the_policy_show_in_both_outputs() {
        let objs = objects(
            [
                node("gpu-1")
                    .cpu("96")
                    .resource("nvidia.com/gpu", "8")
                    .label("node.kubernetes.io/instance-type", "p4d.24xlarge"),
                node("cpu-1")
                    .cpu("16")
                    .label("node.kubernetes.io/instance-type", "m5.4xlarge"),
                node("other").cpu("16"),
            ],
            [
                pod("api").on("gpu-1").cpu("2").owned_by_rs("api"),
                pod("db").on("cpu-1").cpu("10").owned_by_rs("db"),
                pod("batch").on("other").cpu("10").owned_by_rs("batch"),
            ],
        );
        let spec: ebb_api::ScaleDownPolicySpec = serde_json::from_value(serde_json::json!({
            "prices": {"perHour": {"p4d.24xlarge": 32.77, "m5.4xlarge": 0.768}}
        }))
        .unwrap();
        let now: Timestamp = "2026-11-22T06:00:00Z".parse().unwrap();
        let report = plan_objects(&objs, &spec, now).unwrap();
        let doc = serde_json::to_value(&report.document).unwrap();
        // gpu-1 (no GPU requested) goes; its cpu pod moves to cpu-1 or other.
        assert_eq!(doc["candidates"][0]["node"], "gpu-1");
        assert_eq!(doc["candidates"][0]["hourlyCost"], 32.77);
        assert_eq!(doc["cost"]["removedPerHour"], 32.77);
        assert_eq!(doc["cost"]["keptPerHour"], 0.768);
        assert_eq!(doc["cost"]["unpricedNodes"], 1, "`other` has no price");
        assert!(
            report
                .table
                .ends_with("hourly cost: 32.77 removed, 0.77 kept (1 nodes unpriced)\n"),
            "{}",
            report.table
        );
        // Without prices, neither output speaks of cost.
        let report = plan_objects(&objs, &ebb_api::ScaleDownPolicySpec::default(), now).unwrap();
        let doc = serde_json::to_value(&report.document).unwrap();
        assert!(doc.get("cost").is_none(), "{doc}");
        assert!(doc["candidates"][0].get("hourlyCost").is_none());
        assert!(!report.table.contains("hourly cost"));
    }
}
