//! The Cluster API harness (`ebb_e2e::capi`) on a real control plane: Cluster API's CRDs from
//! its Go module, a MachineDeployment over kwok nodes as Cluster API would have made it, the
//! `/scale` subresource the ClusterAPI removal method writes (and its optimistic concurrency),
//! and Cluster API's own core manager deleting the Machine annotated
//! `cluster.x-k8s.io/delete-machine` when the MachineDeployment is scaled down.
//!
//! Needs Go 1.26+ and the Go module proxy on first run (`e2e/k8s/build.sh`, `build.sh capi` and
//! `build.sh capi manager`); a missing prerequisite fails the test with the reason.

use std::time::Duration;

use ebb_api::reasons::UnremovableReason;
use ebb_e2e::capi::{self, Kind};
use ebb_e2e::harness::{Backend, TestEnv, wait_for};
use ebb_e2e::setup::{
    Cluster, Controller, NodeGroup, create_policy, fast_policy_spec, merged, nodes,
};
use kube::api::PostParams;
use serde_json::json;

const NS: &str = "default";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn machine_deployment_scale_and_delete_machine() {
    // A control plane of its own even with EBB_E2E_KUBECONFIG set: the test installs
    // cluster-scoped CRDs and logs Cluster API's manager into the control plane's directory.
    let env = TestEnv::start_real(0)
        .await
        .expect("a real control plane (see e2e/k8s/README.md)");
    let c = Cluster {
        env,
        time_factor: 1.0,
    };
    let client = c.client().clone();
    capi::install_crds(&c.env)
        .await
        .expect("Cluster API's CRDs installed (build.sh capi)");

    c.add_nodes(&NodeGroup::plain("capi-", 4, "4", "16Gi"))
        .await
        .expect("4 kwok nodes");
    let node_names: Vec<String> = (0..4).map(|i| format!("capi-{i}")).collect();
    let refs = capi::machine_deployment(&client, NS, "workers", &node_names, Some(1))
        .await
        .expect("the MachineDeployment, MachineSet and Machines");

    // ---- the objects and their owner chain
    let md = capi::api(&client, NS, Kind::MachineDeployment)
        .get(&refs.deployment)
        .await
        .expect("the MachineDeployment");
    assert_eq!(md.data["spec"]["replicas"], 4);
    assert_eq!(
        md.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(capi::MIN_SIZE_ANNOTATION))
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(
        md.metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].kind.as_str()),
        Some("Cluster")
    );
    let ms = capi::api(&client, NS, Kind::MachineSet)
        .get(&refs.machine_set)
        .await
        .expect("the MachineSet");
    let ms_owner = ms
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .expect("the MachineSet has a controller");
    assert_eq!(
        (ms_owner.kind.as_str(), ms_owner.name.as_str()),
        ("MachineDeployment", "workers")
    );
    assert_eq!(ms_owner.uid, md.metadata.uid.clone().unwrap_or_default());
    let ms_labels = ms.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        ms_labels
            .get(capi::DEPLOYMENT_NAME_LABEL)
            .map(String::as_str),
        Some("workers")
    );
    assert_eq!(
        ms_labels.get(capi::CLUSTER_NAME_LABEL).map(String::as_str),
        Some(capi::CLUSTER)
    );
    assert_eq!(
        capi::machine_set_replicas(&client, NS, &refs.machine_set)
            .await
            .expect("MachineSet replicas"),
        4
    );

    let machines = capi::machines(&client, NS).await.expect("the Machines");
    assert_eq!(machines.len(), 4, "{machines:?}");
    let all_nodes = nodes(&client).await;
    for r in &refs.machines {
        let m = machines.get(&r.name).expect("a Machine per node");
        assert_eq!(
            m.owner.as_deref(),
            Some(format!("MachineSet/{}", refs.machine_set).as_str())
        );
        assert_eq!(m.node.as_deref(), Some(r.node.as_str()));
        for (label, value) in [
            (capi::SET_NAME_LABEL, refs.machine_set.as_str()),
            (capi::DEPLOYMENT_NAME_LABEL, "workers"),
            (capi::CLUSTER_NAME_LABEL, capi::CLUSTER),
        ] {
            assert_eq!(
                m.labels.get(label).map(String::as_str),
                Some(value),
                "{m:?}"
            );
        }
        let node = all_nodes.get(&r.node).expect("the Machine's node");
        let ann = node.metadata.annotations.clone().unwrap_or_default();
        for (key, value) in [
            (capi::NODE_MACHINE_ANNOTATION, r.name.as_str()),
            (capi::NODE_CLUSTER_NAMESPACE_ANNOTATION, NS),
            (capi::NODE_CLUSTER_NAME_ANNOTATION, capi::CLUSTER),
            (capi::NODE_OWNER_KIND_ANNOTATION, "MachineSet"),
            (capi::NODE_OWNER_NAME_ANNOTATION, refs.machine_set.as_str()),
        ] {
            assert_eq!(
                ann.get(key).map(String::as_str),
                Some(value),
                "node {}",
                r.node
            );
        }
    }

    // ---- the node to remove: annotated before any scale-down (as the removal method does)
    let victim = refs.machines[2].clone();
    capi::annotate_machine(
        &client,
        NS,
        &victim.name,
        capi::DELETE_MACHINE_ANNOTATION,
        "true",
    )
    .await
    .expect("the delete-machine annotation");

    // ---- /scale: GET, PUT with the read resourceVersion, then a stale PUT gets 409
    let mds = capi::api(&client, NS, Kind::MachineDeployment);
    let scale = mds.get_scale("workers").await.expect("GET scale");
    assert_eq!(scale.spec.as_ref().and_then(|s| s.replicas), Some(4));
    let read_version = scale.metadata.resource_version.clone();
    assert!(read_version.is_some(), "the Scale has a resourceVersion");
    let mut lower = scale.clone();
    if let Some(spec) = lower.spec.as_mut() {
        spec.replicas = Some(3);
    }
    let written = mds
        .replace_scale("workers", &PostParams::default(), &lower)
        .await
        .expect("PUT scale with the read resourceVersion");
    assert_eq!(written.spec.as_ref().and_then(|s| s.replicas), Some(3));
    assert_ne!(written.metadata.resource_version, read_version);
    let mut stale = lower.clone();
    if let Some(spec) = stale.spec.as_mut() {
        spec.replicas = Some(2);
    }
    match mds
        .replace_scale("workers", &PostParams::default(), &stale)
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 409, "{s:?}"),
        other => panic!("a PUT with a stale resourceVersion must get 409 Conflict: {other:?}"),
    }
    assert_eq!(
        capi::deployment_replicas(&client, NS, "workers")
            .await
            .expect("MachineDeployment replicas"),
        3
    );
    // Nothing acts on it yet: the MachineSet and its Machines are as they were.
    assert_eq!(
        capi::machine_set_replicas(&client, NS, &refs.machine_set)
            .await
            .expect("MachineSet replicas"),
        4
    );
    assert_eq!(
        capi::machines(&client, NS).await.expect("Machines").len(),
        4
    );

    // ---- Cluster API's controllers: the MachineDeployment's 3 reaches the MachineSet, which
    // deletes exactly the annotated Machine; the Machine controller deletes its Node.
    let manager = capi::CoreManager::start(&c.env, NS)
        .await
        .expect("Cluster API's core manager (build.sh capi manager)");
    wait_for(
        "the MachineSet scaled to 3",
        Duration::from_secs(30),
        || async {
            let r = capi::machine_set_replicas(&client, NS, &refs.machine_set).await;
            (r.ok()? == 3).then_some(())
        },
    )
    .await
    .expect("the MachineDeployment controller scales the MachineSet");
    wait_for(
        "the annotated Machine and its Node gone",
        Duration::from_secs(30),
        || async {
            let ms = capi::machines(&client, NS).await.ok()?;
            let gone = !ms.contains_key(&victim.name);
            let node_gone = !nodes(&client).await.contains_key(&victim.node);
            (gone && node_gone).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", manager.log_tail(30)));
    let left = capi::machines(&client, NS).await.expect("Machines");
    for r in refs.machines.iter().filter(|r| r.name != victim.name) {
        let m = left
            .get(&r.name)
            .unwrap_or_else(|| panic!("{} was deleted too", r.name));
        assert!(!m.deleting, "{} is being deleted too", r.name);
    }
    let all_nodes = nodes(&client).await;
    for r in refs.machines.iter().filter(|r| r.name != victim.name) {
        assert!(all_nodes.contains_key(&r.node), "node {} deleted", r.node);
    }
    assert!(
        manager.log_text().contains(&format!(
            "Machine {NS}/{} deleting (scale down, deleting 1 of 1)",
            victim.name
        )),
        "the MachineSet controller logs the deletion"
    );
}

// ---- ebb's ClusterAPI removal method ------------------------------------------------------

/// The cluster, Cluster API's CRDs and `count` kwok nodes `<prefix><i>` labelled `pool: <pool>`
/// under the MachineDeployment `md` (min size `min`).
async fn capi_pool(
    prefix: &str,
    count: usize,
    pool: &str,
    md: &str,
    min: Option<i32>,
) -> (Cluster, capi::MachineDeploymentRefs) {
    let c = Cluster::start(Backend::Real, 1.0)
        .await
        .expect("a real control plane (see e2e/k8s/README.md)");
    capi::install_crds(&c.env)
        .await
        .expect("Cluster API's CRDs installed (build.sh capi)");
    c.add_nodes(&NodeGroup {
        labels: json!({ "pool": pool }),
        ..NodeGroup::plain(prefix, count, "4", "16Gi")
    })
    .await
    .expect("kwok nodes");
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
    let refs = capi::machine_deployment(c.client(), NS, md, &names, min)
        .await
        .expect("the MachineDeployment over the nodes");
    (c, refs)
}

fn pool_nodes(
    all: &std::collections::BTreeMap<String, k8s_openapi::api::core::v1::Node>,
    prefix: &str,
) -> Vec<String> {
    all.keys()
        .filter(|n| n.starts_with(prefix))
        .cloned()
        .collect()
}

async fn policy_status(client: &kube::Client, name: &str) -> ebb_api::ScaleDownPolicyStatus {
    kube::Api::<ebb_api::ScaleDownPolicy>::all(client.clone())
        .get(name)
        .await
        .expect("the policy")
        .status
        .unwrap_or_default()
}

/// Ten nodes of one MachineDeployment whose min-size annotation is 5: the policy removes five
/// in parallel through Cluster API. `replicas` goes 10 → 5 exactly; Cluster API's own
/// MachineSet controller deletes exactly the five marked Machines and its Machine controller
/// their Nodes; the other five are left unmarked, `NodeGroupMinSizeReached`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_gives_five_of_ten_machines_back_through_cluster_api() {
    let (c, refs) = capi_pool("md-", 10, "capi", "workers", Some(5)).await;
    let client = c.client().clone();
    let _manager = capi::CoreManager::start(&c.env, NS)
        .await
        .expect("Cluster API's core manager (build.sh capi manager)");
    let ctrl = Controller::spawn_with(&c.env, "ebb-controller", false, "1s", &["--cluster-api"])
        .expect("the controller");
    create_policy(
        &client,
        "capi",
        merged(
            fast_policy_spec("capi"),
            &json!({"removal": {"method": "ClusterAPI", "timeout": "2m"}}),
        ),
    )
    .await
    .expect("the policy");

    let left = wait_for("five nodes left", Duration::from_secs(150), || async {
        let names = pool_nodes(&nodes(&client).await, "md-");
        (names.len() == 5).then_some(names)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\ncontroller log:\n{}", ctrl.lines().join("\n")));
    assert_eq!(
        capi::deployment_replicas(&client, NS, "workers")
            .await
            .expect("replicas"),
        5
    );
    let status = wait_for("removedTotal 5", Duration::from_secs(30), || async {
        let s = policy_status(&client, "capi").await;
        (s.removed_total == 5 && s.draining == 0).then_some(s)
    })
    .await
    .expect("the policy counts five removals");
    // The rest stays, unmarked, held by the group's minimum.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        capi::deployment_replicas(&client, NS, "workers")
            .await
            .expect("replicas"),
        5,
        "replicas lowered exactly once per removed node"
    );
    assert_eq!(pool_nodes(&nodes(&client).await, "md-"), left);
    let machines = capi::machines(&client, NS).await.expect("Machines");
    for r in &refs.machines {
        let m = machines.get(&r.name);
        if left.contains(&r.node) {
            let m = m.expect("a kept node keeps its Machine");
            assert!(!m.deleting, "{m:?}");
            assert!(
                !m.annotations.contains_key(capi::DELETE_MACHINE_ANNOTATION)
                    && !m
                        .annotations
                        .contains_key(ebb_api::names::ANNOTATION_MACHINE_REMOVAL),
                "a kept Machine is not marked: {m:?}"
            );
        } else {
            assert!(
                m.is_none_or(|m| m.deleting),
                "{} left its Machine: {m:?}",
                r.node
            );
        }
    }
    assert!(
        status
            .unremovable
            .iter()
            .any(|r| r.reason == UnremovableReason::NodeGroupMinSizeReached && r.count == 5),
        "{:?}",
        status.unremovable
    );
    let handed = ctrl
        .lines()
        .iter()
        .filter(|l| l.contains("machine handed off"))
        .count();
    assert_eq!(handed, 5, "one hand-off per removed node");
}

/// A controller that died mid-hand-off: node `r-0`'s Machine was marked and the
/// MachineDeployment scaled down (4 → 3) before the restart; node `r-1`'s Machine was marked
/// but the scale was never written. The restarted controller lowers `replicas` once more (3 →
/// 2), never twice, and reports both removals stuck while nothing deletes the Machines; once
/// they and their Nodes go, the drains finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_between_marking_and_scaling_lowers_replicas_once() {
    let (c, refs) = capi_pool("r-", 4, "capi-r", "resume", None).await;
    let client = c.client().clone();
    let mds = capi::api(&client, NS, Kind::MachineDeployment);
    let generation = |md: kube::api::DynamicObject| md.metadata.generation.expect("generation");
    let machine = |node: &str| refs.machine_of(node).expect("machine").to_string();
    let mark = |node: &str, g: i64| format!("{node}@MachineDeployment/resume@{g}");

    let g0 = generation(mds.get("resume").await.expect("md"));
    for (key, value) in [
        (
            capi::DELETE_MACHINE_ANNOTATION,
            "2026-11-24T00:00:00Z".to_string(),
        ),
        (ebb_api::names::ANNOTATION_MACHINE_REMOVAL, mark("r-0", g0)),
    ] {
        capi::annotate_machine(&client, NS, &machine("r-0"), key, &value)
            .await
            .expect("mark r-0");
    }
    let mut scale = mds.get_scale("resume").await.expect("scale");
    if let Some(spec) = scale.spec.as_mut() {
        spec.replicas = Some(3);
    }
    mds.replace_scale("resume", &PostParams::default(), &scale)
        .await
        .expect("scaled 4 → 3");
    let g1 = generation(mds.get("resume").await.expect("md"));
    assert!(g1 > g0, "a /scale write moves the generation ({g0} → {g1})");
    for (key, value) in [
        (
            capi::DELETE_MACHINE_ANNOTATION,
            "2026-11-24T00:00:01Z".to_string(),
        ),
        (ebb_api::names::ANNOTATION_MACHINE_REMOVAL, mark("r-1", g1)),
    ] {
        capi::annotate_machine(&client, NS, &machine("r-1"), key, &value)
            .await
            .expect("mark r-1");
    }
    let taint_value = jiff::Timestamp::now().as_second().to_string();
    for node in ["r-0", "r-1"] {
        kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
            .patch(
                node,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"taints": [{
                    "key": ebb_api::names::TAINT_TO_BE_DELETED,
                    "value": taint_value,
                    "effect": "NoSchedule"}]}})),
            )
            .await
            .expect("taint as a drain in flight");
    }
    // minNodesPerGroup 2: with two nodes going, the other two are kept.
    create_policy(
        &client,
        "resume",
        merged(
            fast_policy_spec("capi-r"),
            &json!({"minNodesPerGroup": 2, "removal": {"method": "ClusterAPI", "timeout": "3s"}}),
        ),
    )
    .await
    .expect("the policy");
    let ctrl = Controller::spawn_with(&c.env, "ebb-controller", false, "1s", &["--cluster-api"])
        .expect("the controller");

    wait_for("replicas 2", Duration::from_secs(60), || async {
        (capi::deployment_replicas(&client, NS, "resume")
            .await
            .ok()?
            == 2)
            .then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\ncontroller log:\n{}", ctrl.lines().join("\n")));
    let status = wait_for("both removals stuck", Duration::from_secs(30), || async {
        let s = policy_status(&client, "resume").await;
        (s.removals_stuck == 2).then_some(s)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\ncontroller log:\n{}", ctrl.lines().join("\n")));
    assert_eq!(
        capi::deployment_replicas(&client, NS, "resume")
            .await
            .expect("replicas"),
        2,
        "lowered once for r-1, not again for r-0"
    );
    for d in &status.draining_nodes {
        let r = d.removal.as_ref().expect("the removal in status");
        assert_eq!(d.phase, ebb_api::reasons::DrainPhase::WaitingForRemoval);
        assert_eq!(r.method, ebb_api::RemovalMethod::ClusterApi);
        assert_eq!(r.object, format!("Machine {NS}/{}", machine(&d.node)));
        assert_eq!(
            r.scaled.as_deref(),
            Some("MachineDeployment default/resume")
        );
        assert!(
            r.stuck
                && r.message
                    .as_deref()
                    .is_some_and(|m| m.contains("still there")),
            "{r:?}"
        );
    }
    let mut drained: Vec<&str> = status
        .draining_nodes
        .iter()
        .map(|d| d.node.as_str())
        .collect();
    drained.sort();
    assert_eq!(drained, ["r-0", "r-1"]);
    for kept in ["r-2", "r-3"] {
        let m = capi::machines(&client, NS).await.expect("Machines");
        let m = m.get(&machine(kept)).expect("kept Machine");
        assert!(
            !m.annotations.contains_key(capi::DELETE_MACHINE_ANNOTATION),
            "{m:?}"
        );
    }

    // What Cluster API would do: the marked Machines and their Nodes go.
    for node in ["r-0", "r-1"] {
        capi::api(&client, NS, Kind::Machine)
            .delete(&machine(node), &Default::default())
            .await
            .expect("delete the Machine");
        kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
            .delete(node, &Default::default())
            .await
            .expect("delete the Node");
    }
    wait_for(
        "both removals finished",
        Duration::from_secs(30),
        || async {
            let s = policy_status(&client, "resume").await;
            (s.removed_total == 2 && s.draining == 0 && s.removals_stuck == 0).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\ncontroller log:\n{}", ctrl.lines().join("\n")));
    assert_eq!(
        capi::deployment_replicas(&client, NS, "resume")
            .await
            .expect("replicas"),
        2
    );
}
