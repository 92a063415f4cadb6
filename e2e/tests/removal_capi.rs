//! The Cluster API harness (`ebb_e2e::capi`) on a real control plane: Cluster API's CRDs from
//! its Go module, a MachineDeployment over kwok nodes as Cluster API would have made it, the
//! `/scale` subresource the ClusterAPI removal method writes (and its optimistic concurrency),
//! and Cluster API's own core manager deleting the Machine annotated
//! `cluster.x-k8s.io/delete-machine` when the MachineDeployment is scaled down.
//!
//! Needs Go 1.26+ and the Go module proxy on first run (`e2e/k8s/build.sh`, `build.sh capi` and
//! `build.sh capi manager`); a missing prerequisite fails the test with the reason.

use std::time::Duration;

use ebb_e2e::capi::{self, Kind};
use ebb_e2e::harness::{TestEnv, wait_for};
use ebb_e2e::setup::{Cluster, NodeGroup, nodes};
use kube::api::PostParams;

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
