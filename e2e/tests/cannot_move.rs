//! Nodes whose pods cannot live elsewhere, or that pods are on their way to, are never drained:
//! on the real control plane (its scheduler, volume binder and preemption), the running
//! controller at its defaults keeps a node whose pod is on a local PersistentVolume (and
//! `ebb-controller plan` says the same), a node a preempting pod is nominated to, and a node a
//! pod is bound to just after ebb tainted it.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use ebb_api::reasons::{BlockingPodReason, UnremovableReason};
use ebb_e2e::harness::{Backend, TestEnv, wait_for, workspace_binary};
use ebb_e2e::removal::policy_status;
use ebb_e2e::setup::{
    Apps, Cluster, Controller, DEFAULT_RECHECK, NodeGroup, bare_pod, controller_audit_user,
    create_policy, fast_policy_spec, has_taint, merged, nodes, wait_running,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const TO_BE_DELETED: &str = "ebb.dev/to-be-deleted";
const CONTROLLER: &str = "ebb-controller";

async fn real() -> Cluster {
    Cluster::start(Backend::Real, 10.0)
        .await
        .expect("the real control plane is needed (see e2e/k8s/README.md)")
}

/// Creates the cluster-scoped object `object`.
async fn create<K>(client: &kube::Client, object: Value) -> K
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let o: K = serde_json::from_value(object).unwrap_or_else(|e| panic!("test object: {e}"));
    Api::<K>::all(client.clone())
        .create(&PostParams::default(), &o)
        .await
        .unwrap_or_else(|e| panic!("creating {:?}: {e}", o.meta().name))
}

/// Creates `object` in namespace `default`.
async fn create_in_default<K>(client: &kube::Client, object: Value) -> K
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let o: K = serde_json::from_value(object).unwrap_or_else(|e| panic!("test object: {e}"));
    Api::<K>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &o)
        .await
        .unwrap_or_else(|e| panic!("creating {:?}: {e}", o.meta().name))
}

/// Writes to `node` by `user` in the audit log (taints, deletes).
fn node_writes(env: &TestEnv, user: &str, node: &str) -> Vec<String> {
    env.audit()
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .filter(|r| r.user == user && r.resource == "nodes" && r.name == node)
        .filter(|r| r.verb != "get" && r.verb != "list" && r.verb != "watch")
        .map(|r| format!("{} {} {}", r.time, r.verb, r.code))
        .collect()
}

async fn unremovable(
    client: &kube::Client,
    node: &str,
    reason: UnremovableReason,
) -> Option<ebb_api::scaledown::UnremovableNodeStatus> {
    policy_status(client, "pool")
        .await?
        .unremovable_nodes
        .into_iter()
        .find(|u| u.node == node && u.reason == reason)
}

/// A Deployment whose pod mounts a local PersistentVolume (a `local:` volume with node affinity
/// to its node, through a `WaitForFirstConsumer` StorageClass the scheduler binds) sits alone on
/// an under-used node of the pool, whose other nodes could take it: the controller never taints
/// that node, its status names the pod and the volume, and `ebb-controller plan` reports the
/// same from the live cluster. The pool's empty node goes, so the policy does act.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_on_a_local_volume_keeps_its_node() {
    let c = real().await;
    let env = &c.env;
    let client = &env.client;
    // Two nodes of the pool kept busy (3 of 4 CPUs), with room for the database pod.
    c.add_nodes(&NodeGroup {
        labels: json!({"pool": "drain"}),
        ..NodeGroup::plain("busy-", 2, "4", "16Gi")
    })
    .await
    .unwrap();
    c.add_apps(&Apps {
        prefix: "busy-",
        count: 1,
        replicas: 2,
        requests: json!({"cpu": "3", "memory": "1Gi"}),
        ..Apps::default()
    })
    .await
    .unwrap();
    wait_running(client, 2).await.unwrap();
    // Then the node of the local volume, and the database that claims it.
    c.add_nodes(&NodeGroup {
        labels: json!({"pool": "drain"}),
        ..NodeGroup::plain("pool-", 1, "4", "16Gi")
    })
    .await
    .unwrap();
    create::<StorageClass>(
        client,
        json!({"metadata": {"name": "local"}, "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer"}),
    )
    .await;
    create::<PersistentVolume>(client,
        json!({"metadata": {"name": "local-pv-0"},
            "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": "local", "persistentVolumeReclaimPolicy": "Retain",
                "local": {"path": "/mnt/disks/0"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["pool-0"]}]}]}}}}),
    )
    .await;
    create_in_default::<PersistentVolumeClaim>(
        client,
        json!({"metadata": {"name": "data", "namespace": "default"},
            "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "5Gi"}}}}),
    )
    .await;
    create_in_default::<Deployment>(
        client,
        json!({"metadata": {"name": "db", "namespace": "default"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}},
                    "spec": {"terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "db", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                        "volumes": [{"name": "data",
                            "persistentVolumeClaim": {"claimName": "data"}}]}}}}),
    )
    .await;
    wait_running(client, 3).await.unwrap();
    let db_node = wait_for(
        "the database pod bound to pool-0",
        Duration::from_secs(30),
        || async {
            Api::<Pod>::namespaced(client.clone(), "default")
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|p| {
                    p.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with("db-"))
                })?
                .spec?
                .node_name
        },
    )
    .await
    .unwrap();
    assert_eq!(
        db_node, "pool-0",
        "the scheduler binds the claim to the only volume"
    );
    // An empty node for the policy to remove: proof that it acts.
    c.add_nodes(&NodeGroup {
        labels: json!({"pool": "drain"}),
        ..NodeGroup::plain("spare-", 1, "4", "16Gi")
    })
    .await
    .unwrap();

    let _ctl = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    create_policy(client, "pool", fast_policy_spec("drain"))
        .await
        .unwrap();
    let pinned = wait_for(
        "pool-0 reported pinned",
        Duration::from_secs(30),
        || async { unremovable(client, "pool-0", UnremovableReason::BlockedByPod).await },
    )
    .await
    .unwrap();
    assert_eq!(pinned.pod_reason, Some(BlockingPodReason::PinnedToNode));
    assert!(
        pinned
            .pod
            .as_deref()
            .is_some_and(|p| p.starts_with("default/db-"))
    );
    let message = pinned.message.unwrap_or_default();
    assert!(
        message.contains("local-pv-0") && message.contains("default/data"),
        "the status names the claim and the volume: {message}"
    );
    wait_for(
        "the spare node removed",
        Duration::from_secs(30),
        || async { (!nodes(client).await.contains_key("spare-0")).then_some(()) },
    )
    .await
    .unwrap();
    // A few more loops: still never touched.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let user = controller_audit_user(env, "pool").await.unwrap();
    let writes = node_writes(env, &user, "pool-0");
    assert!(
        writes.is_empty(),
        "the controller never wrote pool-0: {writes:?}"
    );
    assert!(nodes(client).await.contains_key("pool-0"));

    // The offline planner, pointed at the same cluster, says the same.
    let policy = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        policy.path(),
        serde_json::to_string(&json!({"kind": "ScaleDownPolicy",
            "apiVersion": "ebb.dev/v1alpha1", "metadata": {"name": "pool"},
            "spec": fast_policy_spec("drain")}))
        .unwrap(),
    )
    .unwrap();
    let out = tokio::process::Command::new(workspace_binary("ebb-controller").unwrap())
        .args(["plan", "-o", "json", "--policy"])
        .arg(policy.path())
        .env("KUBECONFIG", &env.kubeconfig)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = doc["unremovable"]
        .as_array()
        .and_then(|a| a.iter().find(|u| u["node"] == "pool-0"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(row["podReason"], "PinnedToNode", "plan: {doc:#}");
    assert!(
        row["message"]
            .as_str()
            .is_some_and(|m| m.contains("local-pv-0")),
        "plan: {row:#}"
    );
}

/// A node a preempting pod is nominated to, then bound to, is not removed. pool-0 holds one pod
/// without a controller (it keeps the node); a higher-priority pod that fits only there preempts
/// it. While the victim terminates (20 s) nothing on pool-0 blocks and, without the preemptor,
/// its use would be under the threshold: the preemptor, nominated to it, counts there (the node
/// is not under-used), and once bound it keeps the node as a pod just arrived (`PodsArriving`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_a_pod_is_nominated_to_stays() {
    let c = real().await;
    let env = &c.env;
    let client = &env.client;
    c.add_nodes(&NodeGroup {
        labels: json!({"pool": "drain"}),
        ..NodeGroup::plain("pool-", 2, "2", "8Gi")
    })
    .await
    .unwrap();
    create::<PriorityClass>(
        client,
        json!({"metadata": {"name": "urgent"}, "value": 1000000}),
    )
    .await;
    create_in_default::<Pod>(
        client,
        json!({"metadata": {"name": "victim", "namespace": "default"},
            "spec": {"nodeName": "pool-0", "terminationGracePeriodSeconds": 20,
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "1500m"}}}]}}),
    )
    .await;
    wait_running(client, 1).await.unwrap();
    let _ctl = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    create_policy(
        client,
        "pool",
        merged(
            fast_policy_spec("drain"),
            &json!({"utilizationThreshold": 1.0}),
        ),
    )
    .await
    .unwrap();
    // The empty node goes; pool-0 is kept by its pod.
    wait_for("pool-1 removed", Duration::from_secs(30), || async {
        (!nodes(client).await.contains_key("pool-1")).then_some(())
    })
    .await
    .unwrap();
    wait_for(
        "pool-0 blocked by its pod",
        Duration::from_secs(20),
        || async { unremovable(client, "pool-0", UnremovableReason::BlockedByPod).await },
    )
    .await
    .unwrap();
    create_in_default::<Pod>(
        client,
        json!({"metadata": {"name": "preemptor", "namespace": "default"},
            "spec": {"priorityClassName": "urgent", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "1500m"}}}]}}),
    )
    .await;
    wait_for(
        "the preemptor nominated to pool-0",
        Duration::from_secs(20),
        || async {
            let p = Api::<Pod>::namespaced(client.clone(), "default")
                .get("preemptor")
                .await
                .ok()?;
            (p.status?.nominated_node_name.as_deref() == Some("pool-0")).then_some(())
        },
    )
    .await
    .unwrap();
    // The victim (1.5 of 2 CPUs, 0.75) is under the threshold of 1; with the preemptor on its
    // way there it is not.
    let full = wait_for(
        "pool-0 counted with the pod on its way",
        Duration::from_secs(15),
        || async { unremovable(client, "pool-0", UnremovableReason::NotUnderutilized).await },
    )
    .await;
    let bound_yet = Api::<Pod>::namespaced(client.clone(), "default")
        .get("preemptor")
        .await
        .ok()
        .and_then(|p| p.spec?.node_name);
    assert!(
        full.is_ok() && bound_yet.is_none(),
        "while nominated, the preemptor uses pool-0's capacity: {full:?}, bound {bound_yet:?}"
    );
    let arriving = wait_for(
        "pool-0 kept for the pod just bound",
        Duration::from_secs(40),
        || async { unremovable(client, "pool-0", UnremovableReason::PodsArriving).await },
    )
    .await
    .unwrap();
    assert!(
        arriving
            .message
            .as_deref()
            .is_some_and(|m| m.contains("default/preemptor")),
        "{arriving:?}"
    );
    let bound = Api::<Pod>::namespaced(client.clone(), "default")
        .get("preemptor")
        .await
        .ok()
        .and_then(|p| p.spec?.node_name);
    assert_eq!(bound.as_deref(), Some("pool-0"));
    let user = controller_audit_user(env, "pool").await.unwrap();
    let writes = node_writes(env, &user, "pool-0");
    assert!(
        !writes.iter().any(|w| w.contains("delete")) && nodes(client).await.contains_key("pool-0"),
        "pool-0 was never deleted: {writes:?}"
    );
    let all = nodes(client).await;
    assert!(!has_taint(&all["pool-0"], TO_BE_DELETED));
}

/// A pod bound to a node just after ebb tainted it (a binding under way, or a pod created with
/// `spec.nodeName`) keeps the node: the drain gives up, the taint goes, the pod runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_bound_after_the_taint_keeps_its_node() {
    let c = real().await;
    let env = &c.env;
    let client = &env.client;
    c.add_nodes(&NodeGroup {
        labels: json!({"pool": "drain"}),
        ..NodeGroup::plain("pool-", 1, "4", "16Gi")
    })
    .await
    .unwrap();
    c.add_nodes(&NodeGroup::plain("keep-", 1, "8", "32Gi"))
        .await
        .unwrap();
    let mut ctl = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    create_policy(client, "pool", fast_policy_spec("drain"))
        .await
        .unwrap();
    wait_for(
        "pool-0 tainted to-be-deleted",
        Duration::from_secs(30),
        || async {
            nodes(client)
                .await
                .get("pool-0")
                .is_some_and(|n| has_taint(n, TO_BE_DELETED))
                .then_some(())
        },
    )
    .await
    .unwrap();
    bare_pod(client, "late", "pool-0").await.unwrap();
    let gave_up = wait_for(
        "the drain of pool-0 given up",
        Duration::from_secs(30),
        || async {
            ctl.lines()
                .iter()
                .any(|l| l.contains("drain abandoned") && l.contains("PodsLanded"))
                .then_some(())
        },
    )
    .await;
    let all = nodes(client).await;
    assert!(
        all.contains_key("pool-0"),
        "pool-0 was deleted with a pod on it; {gave_up:?}"
    );
    gave_up.unwrap();
    wait_for("the taint taken off", Duration::from_secs(10), || async {
        let all = nodes(client).await;
        (!has_taint(&all["pool-0"], TO_BE_DELETED)).then_some(())
    })
    .await
    .unwrap();
    let late = Api::<Pod>::namespaced(client.clone(), "default")
        .get("late")
        .await
        .unwrap();
    assert!(
        late.metadata.deletion_timestamp.is_none(),
        "the pod was left alone"
    );
    let _ = ctl.kill().await;
    let evictions: BTreeSet<String> = env
        .audit()
        .unwrap()
        .into_iter()
        .filter(|r| r.subresource == "eviction")
        .map(|r| r.name)
        .collect();
    assert!(!evictions.contains("late"), "{evictions:?}");
}
