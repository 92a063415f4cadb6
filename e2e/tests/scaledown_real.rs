//! A scale-down on a real control plane (kube-apiserver, controller-manager, scheduler, kwok):
//! the real `ebb-controller run` drains and deletes a pool of three kwok nodes through the real
//! Eviction API; judged from the API server's audit log and the cluster's final state.

use std::collections::BTreeSet;
use std::time::Duration;

use ebb_e2e::harness::{TestEnv, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const REPLICAS: usize = 3;

fn create<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

/// Pods of the Deployment that are Running and Ready, with their nodes.
async fn running(client: &kube::Client) -> Vec<(String, String)> {
    Api::<Pod>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().is_some_and(|s| {
                    s.phase.as_deref() == Some("Running")
                        && s.conditions
                            .iter()
                            .flatten()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                })
        })
        .map(|p| {
            (
                p.metadata.name.unwrap_or_default(),
                p.spec.and_then(|s| s.node_name).unwrap_or_default(),
            )
        })
        .collect()
}

async fn node_names(client: &kube::Client) -> BTreeSet<String> {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_three_kwok_nodes_is_drained_and_deleted() {
    let env = TestEnv::start_real(6).await.unwrap();
    let real = env.real().expect("a real control plane");
    let c = env.client.clone();
    for crd in ebb_api::crdgen::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        Api::<CustomResourceDefinition>::all(c.clone())
            .patch(
                &name,
                &PatchParams::apply("ebb-e2e").force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap();
    }
    Api::<Namespace>::all(c.clone())
        .create(
            &PostParams::default(),
            &create(json!({"metadata": {"name": "ebb-system"}})),
        )
        .await
        .unwrap();
    // Three of the six nodes are the pool being retired.
    let pool: BTreeSet<String> = (0..3).map(|i| format!("kwok-node-{i}")).collect();
    for n in &pool {
        Api::<Node>::all(c.clone())
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"pool": "drain"}}})),
            )
            .await
            .unwrap();
    }
    // The pods start on the pool (the other nodes cordoned meanwhile): one per pool node.
    let others: Vec<String> = (3..6).map(|i| format!("kwok-node-{i}")).collect();
    let cordon = |on: bool| {
        let c = c.clone();
        let others = others.clone();
        async move {
            for n in &others {
                Api::<Node>::all(c.clone())
                    .patch(
                        n,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"unschedulable": on}})),
                    )
                    .await
                    .unwrap();
            }
        }
    };
    cordon(true).await;
    Api::<Deployment>::namespaced(c.clone(), "default")
        .create(
            &PostParams::default(),
            &create(json!({
                "metadata": {"name": "web"},
                "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                        "spec": {"terminationGracePeriodSeconds": 2,
                        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": "kubernetes.io/hostname",
                             "labelSelector": {"matchLabels": {"app": "web"}}}]}},
                            "containers": [{"name": "web", "image": "web",
                                "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}}]}}}
            })),
        )
        .await
        .unwrap();
    Api::<PodDisruptionBudget>::namespaced(c.clone(), "default")
        .create(
            &PostParams::default(),
            &create(json!({
                "metadata": {"name": "web"},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}
            })),
        )
        .await
        .unwrap();
    let before = wait_for("3 pods running", Duration::from_secs(60), || async {
        let r = running(&c).await;
        (r.len() == REPLICAS).then_some(r)
    })
    .await
    .unwrap();
    let on_pool = before.iter().filter(|(_, n)| pool.contains(n)).count();
    assert!(
        on_pool == REPLICAS,
        "the scheduler put pods on the pool: {before:?}"
    );
    cordon(false).await;
    // The pool is being retired: no new pods there. (Without this the real scheduler may put
    // replacements back on pool nodes: it only weighs the soft candidate taint.)
    for n in &pool {
        Api::<Node>::all(c.clone())
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": [
                    {"key": "retiring", "value": "true", "effect": "NoSchedule"}]}})),
            )
            .await
            .unwrap();
    }

    let mut ctl = env
        .spawn_binary(
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
                "info",
            ],
        )
        .unwrap();
    // The controller's log, kept to show when the test fails.
    let log = ctl.capture_output();
    let policy: ebb_api::ScaleDownPolicy = create(json!({
        "apiVersion": "ebb.dev/v1alpha1", "kind": "ScaleDownPolicy",
        "metadata": {"name": "pool"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "drain"}}, "mode": "DrainAndDelete",
                 "scanInterval": "1s", "unneededTime": "0s", "evictionRetryInterval": "500ms",
                 "maxPodEvictionTime": "60s", "recentEvictionWindow": "5s"}
    }));
    wait_for(
        "the policy to be accepted",
        Duration::from_secs(30),
        || async {
            Api::<ebb_api::ScaleDownPolicy>::all(c.clone())
                .create(&PostParams::default(), &policy)
                .await
                .ok()
        },
    )
    .await
    .unwrap();

    let deleted = wait_for(
        "the pool's nodes deleted",
        Duration::from_secs(60),
        || async {
            let now = node_names(&c).await;
            pool.iter().all(|n| !now.contains(n)).then_some(())
        },
    )
    .await;
    if let Err(e) = deleted {
        let status = Api::<ebb_api::ScaleDownPolicy>::all(c.clone())
            .get_opt("pool")
            .await
            .ok()
            .flatten()
            .and_then(|p| p.status);
        let lines: Vec<String> = {
            let log = log.lock().unwrap();
            log[log.len().saturating_sub(80)..].to_vec()
        };
        for l in &lines {
            eprintln!("[controller] {l}");
        }
        let pdb = Api::<PodDisruptionBudget>::namespaced(c.clone(), "default")
            .get("web")
            .await
            .ok()
            .and_then(|p| p.status);
        eprintln!("PDB status: {pdb:?}");
        for p in Api::<Pod>::namespaced(c.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
        {
            eprintln!(
                "POD {} node {:?} phase {:?} deleting {:?} conditions {:?}",
                p.metadata.name.unwrap_or_default(),
                p.spec.and_then(|s| s.node_name),
                p.status.as_ref().and_then(|s| s.phase.clone()),
                p.metadata.deletion_timestamp,
                p.status.and_then(|s| s.conditions).map(|cs| cs
                    .into_iter()
                    .map(|c| format!("{}={}", c.type_, c.status))
                    .collect::<Vec<_>>())
            );
        }
        panic!(
            "{e}; nodes now {:?}; policy status {}",
            node_names(&c).await,
            serde_json::to_string_pretty(&status).unwrap_or_default()
        );
    }
    let after = wait_for(
        "3 pods running off the pool",
        Duration::from_secs(60),
        || async {
            let r = running(&c).await;
            (r.len() == REPLICAS && r.iter().all(|(_, n)| !pool.contains(n))).then_some(r)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        node_names(&c).await.len(),
        3,
        "the three other nodes stay: {after:?}"
    );

    // The real API server's audit log: pods left the pool through accepted evictions, and the
    // controller never deleted a pod directly (which would bypass the PDB).
    let text = std::fs::read_to_string(real.dir().join("audit.log")).unwrap();
    let records: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|r: &Value| r["stage"] == "ResponseComplete")
        .collect();
    let is = |r: &Value, verb: &str, resource: &str, sub: Option<&str>| {
        r["verb"] == verb
            && r["objectRef"]["resource"] == resource
            && r["objectRef"]["subresource"].as_str() == sub
    };
    let accepted = records
        .iter()
        .filter(|r| is(r, "create", "pods", Some("eviction")) && r["responseStatus"]["code"] == 201)
        .count();
    assert!(
        accepted >= on_pool,
        "{accepted} accepted evictions for {on_pool} pods on the pool"
    );
    let direct: Vec<&Value> = records
        .iter()
        .filter(|r| {
            is(r, "delete", "pods", None)
                && !r["user"]["username"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("system:")
                && r["user"]["username"] != "kwok-controller"
        })
        .collect();
    assert!(
        direct.is_empty(),
        "pods deleted without the Eviction API: {direct:?}"
    );
    let node_deletes = records
        .iter()
        .filter(|r| is(r, "delete", "nodes", None) && r["responseStatus"]["code"] == 200)
        .count();
    assert_eq!(node_deletes, 3, "one Node deletion per pool node");
}
