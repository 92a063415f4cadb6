//! A GPU node judged by its GPUs on a real control plane: CPU-only pods that keep its cpu busy
//! leave it for a CPU node, and it is removed, while a busier CPU node stays; the policy's
//! prices show in its status.

use std::time::Duration;

use ebb_api::ScaleDownPolicy;
use ebb_api::reasons::UnremovableReason;
use ebb_e2e::harness::{Backend, wait_for};
use ebb_e2e::pdb_safety;
use ebb_e2e::setup::{
    Apps, Cluster, Controller, DEFAULT_RECHECK, NodeGroup, controller_audit_user, create_policy,
    fast_policy_spec, has_taint, merged, node_of, nodes, running_pods, wait_running,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Gives `node` `gpus` allocatable `nvidia.com/gpu`, as a device plugin advertises them.
async fn advertise_gpus(client: &kube::Client, node: &str, gpus: &str) {
    let api: Api<Node> = Api::all(client.clone());
    let res = json!({"nvidia.com/gpu": gpus});
    api.patch_status(
        node,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"capacity": res, "allocatable": res}})),
    )
    .await
    .unwrap_or_else(|e| panic!("advertising GPUs on {node}: {e}"));
    wait_for("the GPUs advertised", Duration::from_secs(20), || async {
        nodes(client)
            .await
            .get(node)
            .and_then(|n| {
                n.status
                    .as_ref()?
                    .allocatable
                    .as_ref()?
                    .get("nvidia.com/gpu")
                    .cloned()
            })
            .filter(|q| q.0 == gpus)
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cpu_pods_leave_a_gpu_node_which_goes_while_a_busier_cpu_node_stays() {
    let c = Cluster::start(Backend::Real, 20.0).await.unwrap();
    let env = &c.env;
    let client = &env.client;
    // cpu-0 first, filled to 3 of 4 cpu (75 %): above the cpu threshold, it stays.
    c.add_nodes(&NodeGroup {
        labels: json!({"pool": "drain", "node.kubernetes.io/instance-type": "m5.xlarge"}),
        ..NodeGroup::plain("cpu-", 1, "4", "16Gi")
    })
    .await
    .unwrap();
    c.add_apps(&Apps {
        prefix: "busy-",
        requests: json!({"cpu": "3", "memory": "256Mi"}),
        ..Apps::default()
    })
    .await
    .unwrap();
    wait_running(client, 1).await.unwrap();
    // Then the GPU node, which only CPU-only pods reach (cpu-0 has no room): 10 of 16 cpu
    // (62 %), no GPU requested.
    c.add_nodes(&NodeGroup {
        labels: json!({"pool": "drain", "node.kubernetes.io/instance-type": "p4d.24xlarge"}),
        ..NodeGroup::plain("gpu-", 1, "16", "64Gi")
    })
    .await
    .unwrap();
    advertise_gpus(client, "gpu-0", "8").await;
    c.add_apps(&Apps {
        prefix: "squat-",
        replicas: 2,
        requests: json!({"cpu": "5", "memory": "256Mi"}),
        pdb: Some(json!({"maxUnavailable": 1})),
        ..Apps::default()
    })
    .await
    .unwrap();
    wait_running(client, 3).await.unwrap();
    let on_gpu = running_pods(client)
        .await
        .iter()
        .filter(|p| node_of(p) == "gpu-0")
        .count();
    assert_eq!(on_gpu, 2, "the CPU-only pods sit on the GPU node");
    // A node the policy does not govern, with room for them.
    c.add_nodes(&NodeGroup {
        labels: json!({"pool": "keep"}),
        ..NodeGroup::plain("keep-", 1, "32", "128Gi")
    })
    .await
    .unwrap();

    let _ctl = Controller::spawn(env, "ebb-controller", false, DEFAULT_RECHECK).unwrap();
    let spec = merged(
        fast_policy_spec("drain"),
        // 0.7, not the default 1: the test is about a busier CPU node staying by its threshold.
        &json!({"utilizationThreshold": 0.7,
            "prices": {"perHour": {"p4d.24xlarge": 32.77, "m5.xlarge": 0.192}}}),
    );
    create_policy(client, "gpus", spec).await.unwrap();

    let policies: Api<ScaleDownPolicy> = Api::all(client.clone());
    let status = || async {
        policies
            .get_opt("gpus")
            .await
            .ok()
            .flatten()
            .and_then(|p| p.status)
    };
    let removed = wait_for("gpu-0 removed", Duration::from_secs(60), || async {
        (!nodes(client).await.contains_key("gpu-0")).then_some(())
    })
    .await;
    if let Err(e) = removed {
        panic!("{e}; policy status: {:?}", status().await);
    }
    wait_running(client, 3).await.unwrap();
    for p in running_pods(client).await {
        let name = p.metadata.name.clone().unwrap_or_default();
        if name.starts_with("squat-") {
            assert_eq!(node_of(&p), "keep-0", "{name}");
        }
    }
    let all = nodes(client).await;
    let cpu = all.get("cpu-0").expect("the busier CPU node stays");
    assert!(!has_taint(cpu, "ebb.dev/to-be-deleted"));
    // The status says why cpu-0 stays and what the kept node costs.
    let s = wait_for(
        "the status after the removal",
        Duration::from_secs(20),
        || async {
            status().await.filter(|s| {
                s.removed_total >= 1
                    && s.cost.as_ref().is_some_and(|c| c.kept_per_hour > 0.0)
                    && s.unremovable_nodes.iter().any(|u| {
                        u.node == "cpu-0" && u.reason == UnremovableReason::NotUnderutilized
                    })
            })
        },
    )
    .await
    .unwrap();
    let cost = s.cost.unwrap();
    assert_eq!(cost.kept_per_hour, 0.192, "cpu-0 is kept");
    assert_eq!(cost.removed_per_hour, 0.0, "nothing else to remove");
    assert_eq!(s.removed_total, 1);
    // Its two pods moved within their budget (one at a time), by the Eviction API.
    let user = controller_audit_user(env, "gpus").await.unwrap();
    pdb_safety::assert_safe(env, &[&user]);
    let direct_deletes = env
        .audit()
        .unwrap()
        .into_iter()
        .filter(|r| r.user == user && r.resource == "pods" && r.subresource.is_empty())
        .filter(|r| r.verb == "delete")
        .count();
    assert_eq!(direct_deletes, 0, "pods are evicted, never deleted");
}
