//! `removal.method: Auto` on a cluster with three kinds of nodes under one policy: two kwok
//! nodes of a Cluster API MachineDeployment, two nodes of a Karpenter NodePool, and two plain
//! kwok nodes, all labelled `pool: mixed`. With `minNodesPerGroup: 1` one node of each group
//! goes (the groups: the MachineDeployment, the NodePool, and the plain nodes, which have
//! none), each by its own method: the Cluster API node's Machine is marked and the
//! MachineDeployment scaled down, the Karpenter node's NodeClaim deleted, the plain Node
//! deleted. And a controller without `--karpenter` leaves Karpenter's nodes alone, reporting
//! them `RemovalMethodNotEnabled`.
//!
//! No Cluster API manager runs: the test deletes the marked Machine and its Node itself, as
//! Cluster API would, after ebb reported the removal stuck.
//!
//! Needs the control plane, Cluster API's CRDs (`build.sh capi`) and `karpenter-kwok`
//! (`build.sh peers karpenter`); each is built on demand, and the test fails with the reason
//! when it cannot be.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ebb_api::reasons::{DrainPhase, UnremovableReason};
use ebb_api::scaledown::RemovalStatus;
use ebb_api::{RemovalMethod, ScaleDownPolicy};
use ebb_e2e::capi::{self, Kind};
use ebb_e2e::harness::{Backend, wait_for};
use ebb_e2e::karpenter::{self, Karpenter, NODEPOOL_LABEL, PoolSpec, Provision, Settings};
use ebb_e2e::removal::{
    abandoned_diagnosis, abandoned_drains, counters, drop_extra_node_claims, policy_events,
    policy_status,
};
use ebb_e2e::setup::{
    AbortOnDrop, Cluster, Controller, NodeGroup, create_policy, fast_policy_spec, fetch_metrics,
    has_taint, merged, metrics_address, nodes,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

const NS: &str = "default";
/// The label every node of the test carries, which the policy selects.
const LABEL: &str = "mixed";
const NODE_POOL: &str = "mixed-karpenter";
const MD: &str = "workers";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn auto_picks_the_method_per_node() {
    let t0 = Instant::now();
    let step = |what: &str| eprintln!("[{:>7.3}s] {what}", t0.elapsed().as_secs_f64());
    karpenter::build()
        .await
        .expect("karpenter-kwok and its CRDs are needed (e2e/k8s/build.sh peers karpenter)");
    let c = Cluster::start(Backend::Real, 30.0)
        .await
        .expect("the real control plane is needed (see e2e/k8s/README.md)");
    let client = c.client().clone();
    capi::install_crds(&c.env)
        .await
        .expect("Cluster API's CRDs installed (build.sh capi)");
    karpenter::install_crds(&c.env)
        .await
        .expect("Karpenter's CRDs installed");
    let k = Karpenter::start(&c.env, &Settings::default())
        .await
        .expect("karpenter-kwok running");
    step("control plane, CRDs and Karpenter ready");

    // Two Cluster API nodes, two plain nodes, two Karpenter nodes; all `pool: mixed`.
    for prefix in ["capi-", "plain-"] {
        c.add_nodes(&NodeGroup {
            labels: json!({ "pool": LABEL }),
            ..NodeGroup::plain(prefix, 2, "4", "16Gi")
        })
        .await
        .expect("kwok nodes");
    }
    let capi_nodes: Vec<String> = (0..2).map(|i| format!("capi-{i}")).collect();
    let plain_nodes: BTreeSet<String> = (0..2).map(|i| format!("plain-{i}")).collect();
    let refs = capi::machine_deployment(&client, NS, MD, &capi_nodes, None)
        .await
        .expect("the MachineDeployment over capi-0 and capi-1");
    assert_eq!(capi::deployment_replicas(&client, NS, MD).await.unwrap(), 2);
    let pool = PoolSpec {
        labels: json!({ "pool": LABEL }),
        ..PoolSpec::new(NODE_POOL)
    };
    assert_eq!(pool.consolidate_after, "Never");
    karpenter::node_pool(&client, &pool).await.unwrap();
    karpenter::wait_node_pool_ready(&client, NODE_POOL, Duration::from_secs(30))
        .await
        .unwrap();
    let p = karpenter::provision(&client, &Provision::new("app", NODE_POOL, 2))
        .await
        .expect("Karpenter brings up two nodes");
    drop_extra_node_claims(&client, NODE_POOL, &p.node_claims).await;
    let karpenter_nodes: BTreeSet<String> = p.nodes.iter().cloned().collect();
    assert_eq!(karpenter_nodes.len(), 2, "{p:?}");
    // Emptied: the provisioning pods go without replacement.
    scale_to_zero(&client, "app").await;
    for n in &karpenter_nodes {
        let labels = nodes(&client).await[n]
            .metadata
            .labels
            .clone()
            .unwrap_or_default();
        assert_eq!(labels.get("pool").map(String::as_str), Some(LABEL), "{n}");
    }
    step("2 Cluster API, 2 Karpenter and 2 plain nodes, all empty");

    // ---- 1. A controller without --karpenter: the Karpenter nodes are not its to remove.
    let only_karpenter = "karpenter-only";
    let ctrl = Controller::spawn_with(&c.env, "ebb-controller", false, "1s", &["--cluster-api"])
        .expect("the controller");
    create_policy(
        &client,
        only_karpenter,
        merged(
            fast_policy_spec(LABEL),
            &json!({"nodeSelector": {"matchLabels": {NODEPOOL_LABEL: NODE_POOL}},
                "minNodesPerGroup": 0}),
        ),
    )
    .await
    .unwrap();
    let s = match wait_for(
        "both Karpenter nodes unremovable: RemovalMethodNotEnabled",
        Duration::from_secs(30),
        || async {
            let s = policy_status(&client, only_karpenter).await?;
            let not_enabled: BTreeSet<String> = s
                .unremovable_nodes
                .iter()
                .filter(|u| u.reason == UnremovableReason::RemovalMethodNotEnabled)
                .map(|u| u.node.clone())
                .collect();
            (not_enabled == karpenter_nodes).then_some(s)
        },
    )
    .await
    {
        Ok(s) => s,
        Err(e) => panic!(
            "{e}; status: {:#?}",
            policy_status(&client, only_karpenter).await
        ),
    };
    assert!(
        s.unremovable
            .iter()
            .any(|r| r.reason == UnremovableReason::RemovalMethodNotEnabled && r.count == 2),
        "{:?}",
        s.unremovable
    );
    // A few more loops: still nothing drained.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = policy_status(&client, only_karpenter).await.unwrap();
    assert_eq!(
        (s.draining, s.removed_total, s.candidates),
        (0, 0, 0),
        "{s:#?}"
    );
    let all = nodes(&client).await;
    for n in &karpenter_nodes {
        let node = all.get(n).unwrap_or_else(|| panic!("{n} gone"));
        assert!(
            !has_taint(node, ebb_api::names::TAINT_TO_BE_DELETED)
                && !has_taint(node, ebb_api::names::TAINT_DELETION_CANDIDATE),
            "{n} tainted: {:?}",
            node.spec.as_ref().and_then(|s| s.taints.clone())
        );
    }
    let claims = karpenter::node_claims(&client).await.unwrap();
    for claim in &p.node_claims {
        let x = claims
            .iter()
            .find(|x| &x.name == claim)
            .unwrap_or_else(|| panic!("NodeClaim {claim} gone: {claims:?}"));
        assert!(x.deletion_timestamp.is_none(), "{x:?}");
    }
    let ebb_user = c.env.audit_user("ebb-controller");
    let audit = c.env.audit().expect("the audit log");
    let touched: Vec<_> = audit
        .iter()
        .filter(|r| r.user == ebb_user)
        .filter(|r| {
            (r.resource == "nodes" && karpenter_nodes.contains(&r.name))
                || r.resource == "nodeclaims.karpenter.sh"
                || r.subresource == "eviction"
        })
        .collect();
    assert!(
        touched.is_empty(),
        "the controller without --karpenter wrote Karpenter's nodes or NodeClaims: {touched:#?}"
    );
    // Deleted while its controller runs (which removes its finalizer), then the controller goes.
    Api::<ScaleDownPolicy>::all(client.clone())
        .delete(only_karpenter, &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the first policy gone", Duration::from_secs(30), || async {
        Api::<ScaleDownPolicy>::all(client.clone())
            .get_opt(only_karpenter)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await
    .unwrap();
    drop(ctrl);
    step("without --karpenter: Karpenter nodes RemovalMethodNotEnabled, untouched");

    // ---- 2. Both methods enabled: one node per group, each by its own method.
    let policy = "mixed";
    let ctrl = Controller::spawn_with(
        &c.env,
        "ebb-controller",
        false,
        "1s",
        &["--cluster-api", "--karpenter"],
    )
    .expect("the controller");
    create_policy(
        &client,
        policy,
        merged(
            fast_policy_spec(LABEL),
            &json!({"minNodesPerGroup": 1, "removal": {"method": "Auto", "timeout": "5s"}}),
        ),
    )
    .await
    .unwrap();
    let seen = StatusLog::watch(&client, policy);
    let diag = |e: anyhow::Error| -> String {
        format!(
            "{e}\nremovals seen in status: {:#?}\nkarpenter-kwok log tail:\n{}",
            seen.removals(),
            k.log_tail(10)
        )
    };

    // The plain group: one Node deleted.
    let plain_removed = wait_for(
        "one plain node deleted",
        Duration::from_secs(30),
        || async {
            let all = nodes(&client).await;
            if all.is_empty() {
                return None;
            }
            let gone: Vec<String> = plain_nodes
                .iter()
                .filter(|n| !all.contains_key(*n))
                .cloned()
                .collect();
            (gone.len() == 1).then(|| gone[0].clone())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{}", diag(e)));
    step("a plain node deleted");

    // The Cluster API group: the Machine marked, replicas 2 → 1, then stuck (no manager).
    let (capi_node, status) = wait_for(
        "a Cluster API removal reported stuck",
        Duration::from_secs(40),
        || async {
            let s = policy_status(&client, policy).await?;
            let d = s.draining_nodes.iter().find(|d| {
                d.removal
                    .as_ref()
                    .is_some_and(|r| r.method == RemovalMethod::ClusterApi && r.stuck)
            })?;
            (s.removals_stuck >= 1).then(|| (d.node.clone(), s.clone()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{}", diag(e)));
    assert!(
        capi_nodes.contains(&capi_node),
        "{capi_node} is not a Cluster API node"
    );
    let machine = refs
        .machine_of(&capi_node)
        .expect("its Machine")
        .to_string();
    let d = status
        .draining_nodes
        .iter()
        .find(|d| d.node == capi_node)
        .unwrap();
    assert_eq!(d.phase, DrainPhase::WaitingForRemoval, "{d:?}");
    let r = d.removal.as_ref().unwrap();
    assert_eq!(r.object, format!("Machine {NS}/{machine}"), "{r:?}");
    assert_eq!(
        r.scaled.as_deref(),
        Some(format!("MachineDeployment {NS}/{MD}").as_str()),
        "{r:?}"
    );
    assert!(
        r.message
            .as_deref()
            .is_some_and(|m| m.contains("still there")),
        "{r:?}"
    );
    assert_eq!(
        capi::deployment_replicas(&client, NS, MD).await.unwrap(),
        1,
        "the MachineDeployment scaled down by one"
    );
    let machines = capi::machines(&client, NS).await.unwrap();
    for m in &refs.machines {
        let info = machines.get(&m.name).expect("both Machines still there");
        assert_eq!(
            info.annotations
                .contains_key(capi::DELETE_MACHINE_ANNOTATION),
            m.name == machine,
            "only {machine} is marked for deletion: {info:?}"
        );
    }
    let stuck_events = policy_events(&client, policy, "RemovalStuck").await;
    let note = stuck_events
        .get(&capi_node)
        .unwrap_or_else(|| panic!("no RemovalStuck Event for {capi_node}: {stuck_events:?}"));
    assert!(
        note.contains(&format!("Machine {NS}/{machine}")) && note.contains("(ClusterAPI)"),
        "{note}"
    );
    step("the Cluster API node's Machine marked, replicas 1, removal stuck");

    // What Cluster API would do: the marked Machine and its Node go; the drain then finishes.
    capi::api(&client, NS, Kind::Machine)
        .delete(&machine, &DeleteParams::default())
        .await
        .expect("delete the Machine");
    Api::<Node>::all(client.clone())
        .delete(&capi_node, &DeleteParams::default())
        .await
        .expect("delete the Node");
    wait_for(
        "the Cluster API removal finished",
        Duration::from_secs(30),
        || async {
            let s = policy_status(&client, policy).await?;
            (!s.draining_nodes.iter().any(|d| d.node == capi_node) && s.removals_stuck == 0)
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{}", diag(e)));
    step("Machine and Node deleted as Cluster API would: the drain finished");

    // The NodePool: one NodeClaim deleted by ebb, and Karpenter terminates its node.
    let waited = wait_for(
        "one Karpenter node and its NodeClaim gone",
        Duration::from_secs(60),
        || async {
            let abandoned: Vec<_> = abandoned_drains(&ctrl.lines())
                .into_iter()
                .filter(|(n, _)| karpenter_nodes.contains(n))
                .collect();
            if abandoned.len() >= 3 {
                return Some(Err(abandoned));
            }
            let all = nodes(&client).await;
            if all.is_empty() {
                return None;
            }
            let claims = karpenter::node_claims(&client).await.ok()?;
            let gone: Vec<String> = karpenter_nodes
                .iter()
                .filter(|n| !all.contains_key(*n))
                .filter(|n| {
                    let claim = p.node_claim_of(n).unwrap_or_default();
                    !claims.iter().any(|x| x.name == claim)
                })
                .cloned()
                .collect();
            (gone.len() == 1).then(|| Ok(gone[0].clone()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{}", diag(e)));
    let karpenter_removed = match waited {
        Ok(n) => n,
        Err(abandoned) => panic!(
            "{}",
            abandoned_diagnosis(&client, &abandoned, &karpenter_nodes).await
        ),
    };
    let karpenter_claim = p.node_claim_of(&karpenter_removed).unwrap().to_string();
    step("a Karpenter node's NodeClaim deleted, Karpenter terminated it");

    // All three counted; the other three stay.
    let s = wait_for("removedTotal 3", Duration::from_secs(15), || async {
        let s = policy_status(&client, policy).await?;
        (s.removed_total == 3 && s.draining == 0).then_some(s)
    })
    .await
    .unwrap_or_else(|e| panic!("{}", diag(e)));
    assert_eq!(s.removals_stuck, 0, "{s:#?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let left: BTreeSet<String> = nodes(&client).await.keys().cloned().collect();
    let expected: BTreeSet<String> = capi_nodes
        .iter()
        .chain(&plain_nodes)
        .chain(&karpenter_nodes)
        .filter(|n| ![&capi_node, &plain_removed, &karpenter_removed].contains(n))
        .cloned()
        .collect();
    assert_eq!(left, expected, "one node of each group removed, no more");
    assert_eq!(
        capi::deployment_replicas(&client, NS, MD).await.unwrap(),
        1,
        "replicas lowered once"
    );
    let s = policy_status(&client, policy).await.unwrap();
    assert_eq!(s.removed_total, 3, "{s:#?}");

    // Status named each node's method and object while it was removed.
    let removals = seen.removals();
    let expect = [
        (
            &plain_removed,
            RemovalMethod::Node,
            format!("Node {plain_removed}"),
        ),
        (
            &capi_node,
            RemovalMethod::ClusterApi,
            format!("Machine {NS}/{machine}"),
        ),
        (
            &karpenter_removed,
            RemovalMethod::Karpenter,
            format!("NodeClaim {karpenter_claim}"),
        ),
    ];
    for (node, method, object) in &expect {
        // A Node deletion is over at once; status may never show it.
        if let Some(r) = removals.get(*node) {
            assert_eq!((&r.method, &r.object), (method, object), "{node}: {r:?}");
        } else {
            assert_eq!(
                *method,
                RemovalMethod::Node,
                "no removal of {node} seen in status: {removals:#?}"
            );
        }
    }
    assert_eq!(
        removals
            .keys()
            .filter(|n| !expect.iter().any(|e| e.0 == *n))
            .count(),
        0,
        "{removals:#?}"
    );

    // NodeRemoved names each method and object.
    let removed_events = wait_for(
        "a NodeRemoved Event per removed node",
        Duration::from_secs(15),
        || async {
            let ev = policy_events(&client, policy, "NodeRemoved").await;
            (ev.len() >= 3).then_some(ev)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{}", diag(e)));
    for (node, method, object) in &expect {
        let note = removed_events
            .get(*node)
            .unwrap_or_else(|| panic!("no NodeRemoved for {node}: {removed_events:?}"));
        assert!(
            note.contains(&format!("node {node} removed"))
                && note.contains(&format!("through {method}: {object}")),
            "{note}"
        );
    }

    // ebb_removals_total: by method and outcome.
    let addr = metrics_address(&ctrl.lines()).expect("the controller logs its /metrics address");
    let text = fetch_metrics(&addr, None).await.expect("/metrics");
    let mut got = counters(&text, "ebb_removals_total");
    // Every outcome starts at 0 (a first failure shows as a rise); compare what happened.
    assert_eq!(
        got.get(&format!("method=Node,outcome=failed,policy={policy}")),
        Some(&0.0),
        "ebb_removals_total starts its failed series at 0: {got:?}"
    );
    got.retain(|_, v| *v != 0.0);
    let want: BTreeMap<String, f64> = [
        ("ClusterAPI", "handed_off"),
        ("ClusterAPI", "stuck"),
        ("ClusterAPI", "removed"),
        ("Karpenter", "handed_off"),
        ("Karpenter", "removed"),
        ("Node", "removed"),
    ]
    .iter()
    .map(|(m, o)| (format!("method={m},outcome={o},policy={policy}"), 1.0))
    .collect();
    assert_eq!(got, want, "ebb_removals_total");

    // The audit log: ebb deleted the plain Node and the NodeClaim, and no other Node.
    let audit = c.env.audit().expect("the audit log");
    let node_deletes: BTreeSet<&str> = audit
        .iter()
        .filter(|r| r.user == ebb_user && r.resource == "nodes" && r.verb == "delete")
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(
        node_deletes,
        BTreeSet::from([plain_removed.as_str()]),
        "ebb deletes only the plain Node itself"
    );
    let claim_deletes: BTreeSet<&str> = audit
        .iter()
        .filter(|r| r.user == ebb_user && r.resource == "nodeclaims.karpenter.sh")
        .filter(|r| r.verb == "delete")
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(claim_deletes, BTreeSet::from([karpenter_claim.as_str()]));
    let mut k = k;
    assert!(k.running(), "karpenter-kwok exited:\n{}", k.log_tail(30));
    step("status, Events, metrics and audit log checked");
}

// ---- helpers ------------------------------------------------------------------------------

async fn scale_to_zero(client: &kube::Client, deployment: &str) {
    Api::<Deployment>::namespaced(client.clone(), NS)
        .patch(
            deployment,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .expect("scale to zero");
    let pods = Api::<Pod>::namespaced(client.clone(), NS);
    wait_for(
        &format!("the {deployment} pods gone"),
        Duration::from_secs(30),
        || async {
            let l = pods
                .list(&ListParams::default().labels(&format!("app={deployment}")))
                .await
                .ok()?;
            l.items.is_empty().then_some(())
        },
    )
    .await
    .unwrap();
}

#[derive(Default)]
struct StatusLogInner {
    /// Per node, the last removal entry seen in `drainingNodes`.
    removals: BTreeMap<String, RemovalStatus>,
}

/// A poll (every 100 ms) of a policy's `status.drainingNodes`, kept after the drains end.
struct StatusLog {
    inner: Arc<Mutex<StatusLogInner>>,
    _task: AbortOnDrop,
}

impl StatusLog {
    fn watch(client: &kube::Client, policy: &str) -> Self {
        let inner = Arc::new(Mutex::new(StatusLogInner::default()));
        let (i, client, policy) = (inner.clone(), client.clone(), policy.to_string());
        let task = tokio::spawn(async move {
            loop {
                if let Some(s) = policy_status(&client, &policy).await {
                    let mut g = i.lock().unwrap_or_else(|e| e.into_inner());
                    for d in s.draining_nodes {
                        if let Some(r) = d.removal {
                            g.removals.insert(d.node, r);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self {
            inner,
            _task: AbortOnDrop(task),
        }
    }

    fn removals(&self) -> BTreeMap<String, RemovalStatus> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .removals
            .clone()
    }
}
