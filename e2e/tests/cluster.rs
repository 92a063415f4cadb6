//! The cluster end to end, on ebb-sim and on a real control plane (the reference ebb-sim is held
//! to): scenarios, scheduling, kubelet start/exit/termination, ReplicaSet/Deployment/
//! StatefulSet/DaemonSet/Job controllers, PDB status and eviction, node loss and garbage
//! collection. Only the node-loss test, which needs the sim's clock, runs on ebb-sim alone.

use std::time::Duration;

use ebb_e2e::harness::{Backend, TestEnv, wait_for};
use ebb_e2e::scenario::Scenario;
use ebb_e2e::setup::{Apps, Cluster, NodeGroup};
use ebb_e2e::{Sim, SimConfig};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

fn fast() -> SimConfig {
    SimConfig {
        time_factor: 20.0,
        ..SimConfig::default()
    }
}

/// `backend` at the sim's `fast()` pace.
async fn start(backend: Backend) -> Cluster {
    Cluster::start(backend, fast().time_factor).await.unwrap()
}

/// `count` nodes `<prefix>0..` (2 cpu, 4Gi) with `labels` and `taints`.
async fn nodes(
    c: &Cluster,
    prefix: &str,
    count: usize,
    labels: serde_json::Value,
    taints: serde_json::Value,
) {
    c.add_nodes(&NodeGroup {
        prefix,
        count,
        cpu: "2",
        memory: "4Gi",
        labels,
        taints,
    })
    .await
    .unwrap();
}

fn load(sim: &Sim, yaml: &str) {
    Scenario::from_yaml(yaml).unwrap().load(&sim.api).unwrap();
}

fn running_ready(p: &Pod) -> bool {
    let st = p.status.as_ref();
    st.and_then(|s| s.phase.as_deref()) == Some("Running")
        && st
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn pods_where(api: &Api<Pod>, sel: &str, f: impl Fn(&Pod) -> bool) -> Vec<Pod> {
    api.list(&ListParams::default().labels(sel))
        .await
        .map(|l| l.items.into_iter().filter(|p| f(p)).collect())
        .unwrap_or_default()
}

ebb_e2e::on_both_backends! {
async fn scenario_deployments_schedule_run_and_pdbs_count(backend) {
    let c = start(backend).await;
    let env = &c.env;
    nodes(&c, "node-", 3, json!({"pool": "a"}), json!([])).await;
    c.add_apps(&Apps {
        prefix: "app-",
        count: 2,
        replicas: 3,
        requests: json!({"cpu": "500m", "memory": "512Mi"}),
        pdb: Some(json!({"minAvailable": 2})),
        ..Apps::default()
    })
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let all = wait_for("6 running pods", T, || async {
        let r = pods_where(&pods, "", running_ready).await;
        (r.len() == 6).then_some(r)
    })
    .await
    .unwrap();
    // Scheduling respected capacity: 2 cpu per node, 500m per pod → at most 4 per node.
    let mut per_node = std::collections::HashMap::new();
    for p in &all {
        *per_node
            .entry(p.spec.as_ref().unwrap().node_name.clone().unwrap())
            .or_insert(0) += 1;
        assert!(p.metadata.owner_references.as_ref().unwrap()[0].kind == "ReplicaSet");
    }
    assert!(per_node.values().all(|n| *n <= 4), "{per_node:?}");
    let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), "default");
    let d = wait_for("deployment available", T, || async {
        let d = deploys.get("app-0").await.ok()?;
        (d.status.as_ref()?.available_replicas == Some(3)).then_some(d)
    })
    .await
    .unwrap();
    assert!(
        d.status
            .unwrap()
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Available" && c.status == "True")
    );
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), "default");
    let st = wait_for("pdb status", T, || async {
        let s = pdbs.get("app-0").await.ok()?.status?;
        (s.current_healthy == 3).then_some(s)
    })
    .await
    .unwrap();
    assert_eq!(
        (st.expected_pods, st.desired_healthy, st.disruptions_allowed),
        (3, 2, 1)
    );

    // One eviction is allowed, the second is refused until a replacement is ready.
    let victims = pods_where(&pods, "app=app-0", running_ready).await;
    pods.evict(
        victims[0].metadata.name.as_deref().unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let e = pods
        .evict(
            victims[1].metadata.name.as_deref().unwrap(),
            &Default::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 429),
        "{e:?}"
    );
    wait_for("replacement running and budget back", T, || async {
        let s = pdbs.get("app-0").await.ok()?.status?;
        (s.current_healthy == 3 && s.disruptions_allowed == 1).then_some(())
    })
    .await
    .unwrap();
    if let Some(sim) = env.sim() {
        assert!(sim.pdb_violations().is_empty());
    }
    assert!(
        env.audit()
            .unwrap()
            .iter()
            .any(|r| r.user == "system:kube-scheduler" && r.subresource == "binding")
    );
}

async fn scheduler_honours_taints_selectors_gates_and_reports_unschedulable(backend) {
    let c = start(backend).await;
    let env = &c.env;
    nodes(
        &c,
        "tainted-",
        1,
        json!({}),
        json!([{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
    )
    .await;
    nodes(&c, "plain-", 1, json!({"disk": "ssd"}), json!([])).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let mk = |name: &str, extra: serde_json::Value| -> Pod {
        let mut p = json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        json_patch::merge(&mut p, &extra);
        serde_json::from_value(p).unwrap()
    };
    pods.create(&PostParams::default(), &mk("plain", json!({})))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &mk("tol", json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": "tainted-0"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "x", "effect": "NoSchedule"}]}}))).await.unwrap();
    pods.create(
        &PostParams::default(),
        &mk(
            "nowhere",
            json!({"spec": {"nodeSelector": {"disk": "hdd"}}}),
        ),
    )
    .await
    .unwrap();
    pods.create(
        &PostParams::default(),
        &mk(
            "gated",
            json!({"spec": {"schedulingGates": [{"name": "ebb.dev/placement"}]}}),
        ),
    )
    .await
    .unwrap();
    let node_of = |p: Pod| p.spec.and_then(|s| s.node_name);
    let plain = wait_for("plain bound", T, || async {
        node_of(pods.get("plain").await.ok()?)
    })
    .await
    .unwrap();
    assert_eq!(plain, "plain-0");
    let tol = wait_for("tol bound", T, || async {
        node_of(pods.get("tol").await.ok()?)
    })
    .await
    .unwrap();
    assert_eq!(tol, "tainted-0");
    let msg = wait_for("unschedulable reported", T, || async {
        let p = pods.get("nowhere").await.ok()?;
        p.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .and_then(|c| c.message)
    })
    .await
    .unwrap();
    assert!(msg.starts_with("0/2 nodes are available"), "{msg}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        node_of(pods.get("gated").await.unwrap()).is_none(),
        "gated pod stays unbound"
    );
    pods.patch(
        "gated",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"schedulingGates": null}})),
    )
    .await
    .unwrap();
    wait_for("gated bound after gate removal", T, || async {
        node_of(pods.get("gated").await.ok()?)
    })
    .await
    .unwrap();
}

async fn statefulset_daemonset_and_job(backend) {
    let cluster = start(backend).await;
    let env = &cluster.env;
    nodes(&cluster, "node-", 2, json!({}), json!([])).await;
    let c = env.client.clone();
    // kwok holds a deleted pod for its whole grace period: 1 s here.
    let tmpl = |app: &str| json!({"metadata": {"labels": {"app": app}}, "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "i"}]}});
    let sts: StatefulSet = serde_json::from_value(
        json!({"metadata": {"name": "db"}, "spec": {"replicas": 3, "serviceName": "db",
        "selector": {"matchLabels": {"app": "db"}}, "template": tmpl("db")}}),
    )
    .unwrap();
    Api::<StatefulSet>::namespaced(c.clone(), "default")
        .create(&PostParams::default(), &sts)
        .await
        .unwrap();
    let ds: DaemonSet = serde_json::from_value(json!({"metadata": {"name": "agent"}, "spec": {
        "selector": {"matchLabels": {"app": "agent"}}, "template": tmpl("agent")}}))
    .unwrap();
    Api::<DaemonSet>::namespaced(c.clone(), "default")
        .create(&PostParams::default(), &ds)
        .await
        .unwrap();
    let mut jt = tmpl("job");
    jt["spec"]["restartPolicy"] = json!("Never");
    let job: Job = serde_json::from_value(
        json!({"metadata": {"name": "once"}, "spec": {"completions": 2, "template": jt}}),
    )
    .unwrap();
    Api::<Job>::namespaced(c.clone(), "default")
        .create(&PostParams::default(), &job)
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let db = wait_for("3 db pods ready", T, || async {
        let r = pods_where(&pods, "app=db", running_ready).await;
        (r.len() == 3).then_some(r)
    })
    .await
    .unwrap();
    let mut names: Vec<String> = db.iter().filter_map(|p| p.metadata.name.clone()).collect();
    names.sort();
    assert_eq!(names, vec!["db-0", "db-1", "db-2"]);
    // A deleted member comes back under the same name.
    let old_uid = pods.get("db-1").await.unwrap().metadata.uid;
    pods.delete("db-1", &DeleteParams::default()).await.unwrap();
    wait_for("db-1 recreated", T, || async {
        let p = pods.get("db-1").await.ok()?;
        (p.metadata.uid != old_uid && running_ready(&p)).then_some(())
    })
    .await
    .unwrap();

    let agents = wait_for("one agent per node", T, || async {
        let r = pods_where(&pods, "app=agent", running_ready).await;
        (r.len() == 2).then_some(r)
    })
    .await
    .unwrap();
    let mut nodes: Vec<String> = agents
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    nodes.sort();
    assert_eq!(nodes, vec!["node-0", "node-1"]);

    let jobs: Api<Job> = Api::namespaced(c.clone(), "default");
    let done = wait_for("job complete", T, || async {
        let j = jobs.get("once").await.ok()?;
        let st = j.status?;
        st.conditions?
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
            .then_some(st.succeeded)
    })
    .await
    .unwrap();
    assert_eq!(done, Some(2));
}
}

/// On ebb-sim only: it advances the sim's clock past the 300 s toleration of the unreachable
/// taint and scripts an OOM kill by annotation. On the real control plane the same takes minutes
/// of wall time (the toleration, PodGC's 40 s quarantine of a deleted node's pods) and kwok
/// kills no container; the real backend's lost-node behaviour ebb relies on is covered by
/// placement.rs (`drained_and_lost_nodes_are_not_pinned_to::real`).
#[tokio::test]
async fn node_loss_scripted_exits_and_replacement() {
    let env = TestEnv::start_on(Backend::Sim, fast(), 0).await.unwrap();
    let sim = env.sim().expect("Backend::Sim is a simulator");
    load(
        sim,
        "nodes: {count: 2}\ndeployments: {count: 1, replicas: 2}\n",
    );
    let c = env.client.clone();
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let nodes: Api<Node> = Api::all(c.clone());
    let before = wait_for("2 running", T, || async {
        let r = pods_where(&pods, "app=app-0", running_ready).await;
        (r.len() == 2).then_some(r)
    })
    .await
    .unwrap();
    let lost = before[0].spec.as_ref().unwrap().node_name.clone().unwrap();
    nodes.delete(&lost, &DeleteParams::default()).await.unwrap();
    wait_for("pods replaced off the lost node", T, || async {
        let r = pods_where(&pods, "app=app-0", running_ready).await;
        (r.len() == 2
            && r.iter().all(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(lost.as_str())
            }))
        .then_some(())
    })
    .await
    .unwrap();

    // A node going NotReady marks its pods not ready and taints it unreachable.
    let alive = if lost == "node-0" { "node-1" } else { "node-0" };
    sim.set_node_ready(alive, false).unwrap();
    wait_for("node not ready, pods not ready", T, || async {
        let n = nodes.get(alive).await.ok()?;
        let unreachable = n
            .spec?
            .taints?
            .iter()
            .any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoExecute");
        let ready = pods_where(&pods, "app=app-0", running_ready).await.len();
        (unreachable && ready == 0).then_some(())
    })
    .await
    .unwrap();

    // Their default 300s toleration of the unreachable NoExecute taint runs out: evicted, and
    // the ReplicaSet's replacements wait (no other node is ready).
    sim.advance(Duration::from_secs(301));
    // They stay Terminating: the node's kubelet cannot confirm.
    wait_for("pods evicted from the unreachable node", T, || async {
        let l = pods
            .list(&ListParams::default().labels("app=app-0"))
            .await
            .ok()?
            .items;
        let on_node: Vec<&Pod> = l
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(alive))
            .collect();
        (!on_node.is_empty()
            && on_node
                .iter()
                .all(|p| p.metadata.deletion_timestamp.is_some()))
        .then_some(())
    })
    .await
    .unwrap();
    assert!(
        sim.audit()
            .iter()
            .any(|r| r.user == "system:taint-eviction-controller" && r.verb == "delete")
    );

    // Scripted outcomes: OOMKilled after 2s (sim time) with restartPolicy Never.
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "oom", "annotations": {"sim.ebb.dev/oom-after": "2s"}},
        "spec": {"restartPolicy": "Never", "tolerations": [{"operator": "Exists"}], "containers": [{"name": "c", "image": "i"}]}})).unwrap();
    nodes
        .patch(
            alive,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"sim.ebb.dev/down": null}}})),
        )
        .await
        .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let term = wait_for("oom pod failed", T, || async {
        let p = pods.get("oom").await.ok()?;
        let st = p.status?;
        (st.phase.as_deref() == Some("Failed")).then(|| {
            st.container_statuses.unwrap()[0]
                .state
                .clone()
                .unwrap()
                .terminated
                .unwrap()
        })
    })
    .await
    .unwrap();
    assert_eq!(
        (term.exit_code, term.reason.as_deref()),
        (137, Some("OOMKilled"))
    );
}

ebb_e2e::on_both_backends! {
/// A deleted pod stays Terminating for its grace period: 600 s on ebb-sim, whose clock the test
/// then advances; 3 s on the real backend, where kwok removes it once the period is over.
async fn graceful_termination_follows_sim_time(backend) {
    let c = Cluster::start(backend, 1.0).await.unwrap();
    let env = &c.env;
    nodes(&c, "node-", 1, json!({}), json!([])).await;
    let grace = match backend {
        Backend::Sim => 600,
        Backend::Real => 3,
    };
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "slow"},
        "spec": {"terminationGracePeriodSeconds": grace, "containers": [{"name": "c", "image": "i"}]}})).unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    wait_for("running", T, || async {
        pods.get("slow").await.ok().filter(running_ready)
    })
    .await
    .unwrap();
    let deleted = std::time::Instant::now();
    pods.delete("slow", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        pods.get("slow")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some(),
        "still terminating within its grace"
    );
    if let Some(sim) = env.sim() {
        sim.advance(Duration::from_secs(601));
    }
    wait_for("gone after the grace period", T, || async {
        pods.get("slow").await.is_err().then_some(())
    })
    .await
    .unwrap();
    if backend == Backend::Real {
        assert!(
            deleted.elapsed() >= Duration::from_millis(2500),
            "removed {:?} after the delete, before its 3 s grace period",
            deleted.elapsed()
        );
    }
}
}
