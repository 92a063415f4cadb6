//! Karpenter's KWOK provider on the real control plane, the ground of `removal.method:
//! Karpenter`: it provisions nodes for pending pods (one NodeClaim each), and deleting a
//! NodeClaim, as ebb does after its drain, makes it terminate that node and no other.
//!
//! Then ebb itself on such a pool (`removal.method: Karpenter`, `--karpenter`): it drains
//! nodes, moving their pods under a PodDisruptionBudget, and deletes their NodeClaims, which
//! Karpenter terminates.
//!
//! Needs the control plane and `karpenter-kwok` (`e2e/k8s/build.sh` and `build.sh peers
//! karpenter`; both are built on demand, and the test fails with the reason when they cannot be).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ebb_api::RemovalMethod;
use ebb_api::reasons::DrainPhase;
use ebb_api::scaledown::RemovalStatus;
use ebb_e2e::harness::{Backend, wait_for};
use ebb_e2e::karpenter::{
    self, DISRUPTED_TAINT, Karpenter, NODEPOOL_LABEL, PoolSpec, Provision, Settings,
};
use ebb_e2e::pdb_safety;
use ebb_e2e::removal::{
    abandoned_diagnosis, abandoned_drains, counters, drop_extra_node_claims, policy_events,
    policy_status,
};
use ebb_e2e::setup::{
    AbortOnDrop, Cluster, Controller, create_policy, fast_policy_spec, fetch_metrics, is_running,
    merged, metrics_address,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const POOL: &str = "karpenter-a";

/// Each step's time, printed at the end (and on failure, up to the step that failed).
struct Steps {
    t0: Instant,
    last: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Steps {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            t0: now,
            last: now,
            done: Vec::new(),
        }
    }

    fn step(&mut self, name: &'static str) -> Duration {
        let now = Instant::now();
        let d = now - self.last;
        self.last = now;
        self.done.push((name, d));
        eprintln!(
            "[{:>7.3}s] {name}: {:.3}s",
            self.t0.elapsed().as_secs_f64(),
            d.as_secs_f64()
        );
        d
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_a_node_claim_removes_its_node_and_no_other() {
    let mut steps = Steps::new();
    karpenter::build()
        .await
        .expect("karpenter-kwok and its CRDs are needed");
    steps.step("build karpenter-kwok (cached)");
    let c = Cluster::start(Backend::Real, 30.0)
        .await
        .expect("the real control plane is needed");
    steps.step("control plane up");
    let client = c.client().clone();
    karpenter::install_crds(&c.env).await.unwrap();
    steps.step("Karpenter CRDs Established");
    let k = Karpenter::start(&c.env, &Settings::default())
        .await
        .unwrap();
    steps.step("karpenter-kwok ready");

    // Karpenter's own consolidation off: only the NodeClaim's deletion removes a node.
    let pool = PoolSpec::new(POOL);
    assert_eq!(pool.consolidate_after, "Never");
    karpenter::node_pool(&client, &pool).await.unwrap();
    karpenter::wait_node_pool_ready(&client, POOL, Duration::from_secs(30))
        .await
        .unwrap();
    steps.step("NodePool Ready");

    let p = karpenter::provision(&client, &Provision::new("app", POOL, 3))
        .await
        .unwrap();
    steps.step("3 nodes provisioned, pods Running");
    eprintln!("nodes {:?}\nNodeClaims {:?}", p.nodes, p.node_claims);

    // Each node is a NodeClaim's (status.nodeName) and carries the pool's label; three distinct.
    let claims = karpenter::node_claims(&client).await.unwrap();
    assert_eq!(claims.len(), 3, "{claims:?}");
    let nodes_api = Api::<Node>::all(client.clone());
    let mut distinct = p.nodes.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{:?}", p.nodes);
    for (node, claim) in p.nodes.iter().zip(&p.node_claims) {
        let info = claims
            .iter()
            .find(|c| &c.name == claim)
            .unwrap_or_else(|| panic!("NodeClaim {claim} not listed: {claims:?}"));
        assert_eq!(info.node_name.as_deref(), Some(node.as_str()), "{info:?}");
        assert_eq!(info.pool.as_deref(), Some(POOL), "{info:?}");
        assert!(info.ready, "{info:?}");
        let n = nodes_api.get(node).await.unwrap();
        let labels = n.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get(NODEPOOL_LABEL).map(String::as_str),
            Some(POOL),
            "node {node} labels {labels:?}"
        );
        assert_eq!(
            karpenter::node_claim_of(&client, node)
                .await
                .unwrap()
                .map(|c| c.name),
            Some(claim.clone())
        );
    }

    // ebb's drain: the victim's pod goes (scale-in, no replacement), the node stays.
    let victim = p.nodes[0].clone();
    let victim_claim = p.node_claims[0].clone();
    karpenter::empty_node(&client, &p, &victim).await.unwrap();
    steps.step("victim node emptied");
    assert!(
        nodes_api.get_opt(&victim).await.unwrap().is_some(),
        "Karpenter removed the empty node {victim} by itself (consolidateAfter: Never)"
    );

    // ebb's removal: delete the NodeClaim; Karpenter terminates its node.
    karpenter::delete_node_claim(&client, &victim_claim)
        .await
        .unwrap();
    let gone = karpenter::wait_gone(&client, &victim_claim, &victim, Duration::from_secs(30))
        .await
        .unwrap();
    steps.step("NodeClaim deleted -> NodeClaim and Node gone");
    eprintln!(
        "after the delete: node deleting {:?}, tainted {DISRUPTED_TAINT} {:?}, node gone {:?}, \
         NodeClaim gone {:?}; taints seen {:?}",
        gone.node_deleting, gone.node_disrupted, gone.node_gone, gone.node_claim_gone, gone.taints
    );
    assert!(
        gone.taints
            .iter()
            .any(|t| t == &format!("{DISRUPTED_TAINT}:NoSchedule")),
        "Karpenter should taint a node it terminates {DISRUPTED_TAINT}:NoSchedule; saw {:?}",
        gone.taints
    );
    assert!(
        gone.node_gone <= Duration::from_secs(15)
            && gone.node_claim_gone <= Duration::from_secs(15),
        "termination took too long: {gone:?}"
    );

    // The other two stay (and no replacement comes: nothing is pending).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = karpenter::node_claims(&client).await.unwrap();
    let mut names: Vec<String> = after.iter().map(|c| c.name.clone()).collect();
    names.sort();
    let mut expected: Vec<String> = p.node_claims[1..].to_vec();
    expected.sort();
    assert_eq!(names, expected, "{after:?}");
    for (node, claim) in p.nodes[1..].iter().zip(&p.node_claims[1..]) {
        let info = after.iter().find(|c| &c.name == claim).unwrap();
        assert!(info.deletion_timestamp.is_none(), "{info:?}");
        assert_eq!(info.node_name.as_deref(), Some(node.as_str()));
        let n = nodes_api.get(node).await.unwrap();
        assert!(
            n.metadata.deletion_timestamp.is_none(),
            "node {node} is being deleted"
        );
        let tainted = n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == DISRUPTED_TAINT);
        assert!(!tainted, "node {node} tainted {DISRUPTED_TAINT}");
    }
    steps.step("the other two stay");
    let mut k = k;
    assert!(k.running(), "karpenter-kwok exited:\n{}", k.log_tail(30));
    for e in k.errors() {
        eprintln!("karpenter-kwok error: {e}");
    }
    eprintln!(
        "steps: {}",
        steps
            .done
            .iter()
            .map(|(n, d)| format!("{n} {:.2}s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join("; ")
    );
}

// ---- ebb's Karpenter removal method ---------------------------------------------------------

const EBB_POOL: &str = "ebb-karpenter";
const POLICY: &str = "karpenter";

/// Four nodes of a NodePool (Karpenter's consolidation off), each running one pod of `web`
/// (600m: one fits beside the 1-CPU pod that made Karpenter launch the node, two fit on an
/// emptied node) under a PodDisruptionBudget `maxUnavailable: 1`; the provisioning pods then
/// go, so every node is underutilised and none is empty. A policy on the NodePool keeping
/// `minNodesPerGroup: 2` drains exactly two of them, moving their `web` pods to the other two,
/// and deletes their NodeClaims (`removal.method: Karpenter`); Karpenter terminates them. Every
/// eviction is ebb's (the nodes were empty when Karpenter got them), no budget was exceeded,
/// and status, Events and metrics name the NodeClaims.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ebb_drains_two_nodes_of_a_node_pool_and_karpenter_terminates_them() {
    let mut steps = Steps::new();
    karpenter::build()
        .await
        .expect("karpenter-kwok and its CRDs are needed (e2e/k8s/build.sh peers karpenter)");
    let c = Cluster::start(Backend::Real, 30.0)
        .await
        .expect("the real control plane is needed (see e2e/k8s/README.md)");
    let client = c.client().clone();
    karpenter::install_crds(&c.env).await.unwrap();
    let k = Karpenter::start(&c.env, &Settings::default())
        .await
        .expect("karpenter-kwok running");
    let pool = PoolSpec::new(EBB_POOL);
    assert_eq!(pool.consolidate_after, "Never");
    karpenter::node_pool(&client, &pool).await.unwrap();
    karpenter::wait_node_pool_ready(&client, EBB_POOL, Duration::from_secs(30))
        .await
        .unwrap();
    steps.step("control plane, Karpenter and its NodePool ready");

    let p = karpenter::provision(&client, &Provision::new("app", EBB_POOL, 4))
        .await
        .expect("Karpenter brings up four nodes");
    let all_nodes: BTreeSet<String> = p.nodes.iter().cloned().collect();
    assert_eq!(all_nodes.len(), 4, "{:?}", p.nodes);
    let extra = drop_extra_node_claims(&client, EBB_POOL, &p.node_claims).await;
    steps.step("4 nodes provisioned");

    // web: one 600m pod per node (1000m + 600m fit in 1900m, 1000m + 1200m do not), and only
    // on these four nodes (a pod that finds no room waits: Karpenter cannot launch a node for
    // a hostname).
    let web_spec = Provision {
        cpu: "600m".into(),
        one_per_node: false,
        ..Provision::new("web", EBB_POOL, 4)
    };
    let web = run_on_nodes(&client, &web_spec, &all_nodes)
        .await
        .expect("the web pods Running");
    assert_eq!(
        web.values().cloned().collect::<BTreeSet<_>>(),
        all_nodes,
        "one web pod on each of the four nodes: {web:?}"
    );
    c.create_pdb(json!({"metadata": {"name": "web", "namespace": "default"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}}))
        .await
        .unwrap();
    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), "default");
    wait_for(
        "the web budget's status (4 healthy, 1 disruption allowed)",
        Duration::from_secs(30),
        || async {
            let s = pdbs.get("web").await.ok()?.status?;
            (s.current_healthy == 4 && s.disruptions_allowed == 1).then_some(())
        },
    )
    .await
    .unwrap();
    // The provisioning pods go (no replacement: the Deployment is scaled to zero).
    Api::<Deployment>::namespaced(client.clone(), "default")
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    wait_for("the app pods gone", Duration::from_secs(30), || async {
        let l = pods
            .list(&ListParams::default().labels("app=app"))
            .await
            .ok()?;
        l.items.is_empty().then_some(())
    })
    .await
    .unwrap();
    steps.step("web on every node under its budget, provisioning pods gone");

    let ctrl = Controller::spawn_with(&c.env, "ebb-controller", false, "1s", &["--karpenter"])
        .expect("the controller");
    create_policy(
        &client,
        POLICY,
        merged(
            fast_policy_spec(EBB_POOL),
            &json!({
                "nodeSelector": {"matchLabels": {NODEPOOL_LABEL: EBB_POOL}},
                "minNodesPerGroup": 2,
                "removal": {"method": "Karpenter", "timeout": "60s"},
            }),
        ),
    )
    .await
    .unwrap();
    let seen = StatusLog::watch(&client, POLICY);

    let fail = |e: anyhow::Error| -> ! {
        panic!(
            "{e}\nstatus seen: {:#?}\nkarpenter-kwok log tail:\n{}",
            seen.removals(),
            k.log_tail(20)
        )
    };
    let waited = wait_for(
        "two NodeClaims and their Nodes gone, removedTotal 2",
        Duration::from_secs(90),
        || async {
            // Drains that keep being abandoned will not finish: fail with why, early.
            let abandoned = abandoned_drains(&ctrl.lines());
            if abandoned.len() >= 3 {
                return Some(Err(abandoned));
            }
            let claims: Vec<_> = karpenter::node_claims(&client)
                .await
                .ok()?
                .into_iter()
                .filter(|x| x.pool.as_deref() == Some(EBB_POOL))
                .collect();
            let nodes = pool_nodes(&client, EBB_POOL).await?;
            let s = policy_status(&client, POLICY).await?;
            (claims.len() == 2 && nodes.len() == 2 && s.removed_total == 2 && s.draining == 0).then(
                || {
                    Ok((
                        claims.into_iter().map(|x| x.name).collect::<BTreeSet<_>>(),
                        nodes,
                    ))
                },
            )
        },
    )
    .await
    .unwrap_or_else(|e| fail(e));
    let (kept_claims, kept_nodes) = match waited {
        Ok(kept) => kept,
        Err(abandoned) => panic!(
            "{}",
            abandoned_diagnosis(&client, &abandoned, &all_nodes).await
        ),
    };
    steps.step("ebb drained two nodes, Karpenter terminated them");

    let removed_nodes: BTreeSet<String> = all_nodes.difference(&kept_nodes).cloned().collect();
    assert_eq!(
        removed_nodes.len(),
        2,
        "kept {kept_nodes:?} of {all_nodes:?}"
    );
    let claim_of = |n: &str| p.node_claim_of(n).expect("a provisioned node").to_string();
    let removed_claims: BTreeSet<String> = removed_nodes.iter().map(|n| claim_of(n)).collect();
    assert_eq!(
        kept_claims,
        kept_nodes
            .iter()
            .map(|n| claim_of(n))
            .collect::<BTreeSet<_>>(),
        "the kept nodes keep their own NodeClaims, and Karpenter launched none"
    );

    // Exactly two: nothing else goes while minNodesPerGroup holds the other two.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        pool_nodes(&client, EBB_POOL).await.expect("nodes"),
        kept_nodes,
        "a third node went"
    );
    let s = policy_status(&client, POLICY).await.expect("status");
    assert_eq!(s.removed_total, 2, "{s:?}");
    assert_eq!(s.removals_stuck, 0, "{s:?}");
    for n in &kept_nodes {
        let node = Api::<Node>::all(client.clone()).get(n).await.unwrap();
        assert!(
            node.metadata.deletion_timestamp.is_none(),
            "kept node {n} deleting"
        );
        let taints: Vec<String> = node
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect();
        assert!(
            !taints
                .iter()
                .any(|t| t == DISRUPTED_TAINT || t == ebb_api::names::TAINT_TO_BE_DELETED),
            "kept node {n} tainted {taints:?}"
        );
    }

    // Status named the NodeClaims while the removals were under way.
    let removals = seen.removals();
    for n in &removed_nodes {
        let r = removals
            .get(n)
            .unwrap_or_else(|| panic!("no removal of {n} seen in status: {removals:#?}"));
        assert_eq!(r.method, RemovalMethod::Karpenter, "{r:?}");
        assert_eq!(r.object, format!("NodeClaim {}", claim_of(n)), "{r:?}");
        assert_eq!(r.scaled, None, "{r:?}");
        assert!(!r.stuck, "{r:?}");
        let phases = seen.phases(n);
        assert!(
            phases.contains(&DrainPhase::WaitingForRemoval),
            "{n} was seen only in phases {phases:?}"
        );
    }
    assert!(
        kept_nodes.iter().all(|n| !removals.contains_key(n)),
        "a kept node was drained: {removals:#?}"
    );

    // Events: a hand-off and a removal per node, naming the method and the NodeClaim.
    let removed_events = wait_for(
        "a NodeRemoved Event per removed node",
        Duration::from_secs(15),
        || async {
            let ev = policy_events(&client, POLICY, "NodeRemoved").await;
            (ev.len() >= 2).then_some(ev)
        },
    )
    .await
    .unwrap();
    let handed_events = policy_events(&client, POLICY, "MachineHandedOff").await;
    for n in &removed_nodes {
        let claim = claim_of(n);
        let note = removed_events
            .get(n)
            .unwrap_or_else(|| panic!("no NodeRemoved for {n}: {removed_events:?}"));
        assert!(
            note.contains(&format!("node {n} removed"))
                && note.contains(&format!("through Karpenter: NodeClaim {claim}")),
            "{note}"
        );
        let note = handed_events
            .get(n)
            .unwrap_or_else(|| panic!("no MachineHandedOff for {n}: {handed_events:?}"));
        assert!(
            note.contains(&format!("NodeClaim {claim} deleted (Karpenter)")),
            "{note}"
        );
    }
    assert_eq!(
        removed_events.keys().cloned().collect::<BTreeSet<_>>(),
        removed_nodes
    );

    // Metrics: two hand-offs and two removals by Karpenter, nothing else.
    let addr = metrics_address(&ctrl.lines()).expect("the controller logs its /metrics address");
    let text = fetch_metrics(&addr, None).await.expect("/metrics");
    let mut removals_metric = counters(&text, "ebb_removals_total");
    // Every outcome starts at 0, so a first failure shows as a rise, not as a new series.
    assert_eq!(
        removals_metric.get(&format!("method=Karpenter,outcome=failed,policy={POLICY}")),
        Some(&0.0),
        "ebb_removals_total starts its failed series at 0: {removals_metric:?}"
    );
    removals_metric.retain(|_, v| *v != 0.0);
    let expected: BTreeMap<String, f64> = [
        (
            format!("method=Karpenter,outcome=handed_off,policy={POLICY}"),
            2.0,
        ),
        (
            format!("method=Karpenter,outcome=removed,policy={POLICY}"),
            2.0,
        ),
    ]
    .into();
    assert_eq!(removals_metric, expected, "ebb_removals_total");

    // The audit log: every eviction is ebb's, one per web pod of a removed node, accepted
    // within the budget; the NodeClaims were deleted by ebb, each once.
    let audit = c.env.audit().expect("the audit log");
    let ebb_user = c.env.audit_user("ebb-controller");
    let karpenter_user = audit
        .iter()
        .find(|r| r.resource == "nodeclaims.karpenter.sh" && r.verb == "create")
        .map(|r| r.user.clone())
        .expect("Karpenter created the NodeClaims");
    assert_ne!(karpenter_user, ebb_user);
    let evictions: Vec<_> = audit
        .iter()
        .filter(|r| r.resource == "pods" && r.subresource == "eviction")
        .collect();
    let not_ebb: Vec<_> = evictions.iter().filter(|r| r.user != ebb_user).collect();
    assert!(
        not_ebb.is_empty(),
        "evictions by others than ebb ({karpenter_user} is Karpenter): {not_ebb:#?}"
    );
    let evicted: BTreeSet<String> = evictions
        .iter()
        .filter(|r| (200..300).contains(&r.code))
        .map(|r| r.name.clone())
        .collect();
    let web_on_removed: BTreeSet<String> = web
        .iter()
        .filter(|(_, n)| removed_nodes.contains(*n))
        .map(|(p, _)| p.clone())
        .collect();
    assert_eq!(
        evicted, web_on_removed,
        "ebb evicted exactly the web pods of the removed nodes"
    );
    // ebb deletes each removed NodeClaim once, first; Karpenter deletes it again as it
    // finalizes it (a no-op on an object already being deleted), and no kept NodeClaim.
    let claim_deletes: Vec<(String, String)> = audit
        .iter()
        .filter(|r| r.resource == "nodeclaims.karpenter.sh" && r.verb == "delete")
        .filter(|r| (200..300).contains(&r.code))
        // The set-up's own deletes of NodeClaims Karpenter launched beyond the ones asked for.
        .filter(|r| !extra.contains(&r.name))
        .map(|r| (r.user.clone(), r.name.clone()))
        .collect();
    let by_ebb: Vec<&String> = claim_deletes
        .iter()
        .filter(|(u, _)| *u == ebb_user)
        .map(|(_, n)| n)
        .collect();
    assert_eq!(by_ebb.len(), 2, "{claim_deletes:?}");
    assert_eq!(
        by_ebb.into_iter().cloned().collect::<BTreeSet<_>>(),
        removed_claims,
        "{claim_deletes:?}"
    );
    for claim in &removed_claims {
        let first = claim_deletes.iter().find(|(_, n)| n == claim);
        assert_eq!(
            first.map(|(u, _)| u.as_str()),
            Some(ebb_user.as_str()),
            "{claim_deletes:?}"
        );
    }
    assert!(
        claim_deletes
            .iter()
            .all(|(_, n)| removed_claims.contains(n)),
        "a kept NodeClaim was deleted: {claim_deletes:?}"
    );
    pdb_safety::assert_safe(&c.env, &[&ebb_user, &karpenter_user]);

    // web is whole again, on the kept nodes.
    let web_pods = wait_for("four web pods Running", Duration::from_secs(30), || async {
        let l = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .ok()?;
        let running: Vec<Pod> = l.items.into_iter().filter(is_running).collect();
        (running.len() == 4).then_some(running)
    })
    .await
    .unwrap();
    for pod in &web_pods {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        assert!(kept_nodes.contains(&node), "web pod on {node}");
    }
    let mut k = k;
    assert!(k.running(), "karpenter-kwok exited:\n{}", k.log_tail(30));
    steps.step("checked status, Events, metrics, audit log and pods");
    drop(ctrl);
    eprintln!(
        "steps: {}",
        steps
            .done
            .iter()
            .map(|(n, d)| format!("{n} {:.2}s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join("; ")
    );
}

// ---- helpers ------------------------------------------------------------------------------

/// Applies `spec`'s Deployment with a required node affinity to `nodes` (by their
/// `kubernetes.io/hostname` label), waits until its pods all run, and returns pod → node.
async fn run_on_nodes(
    client: &kube::Client,
    spec: &Provision,
    nodes: &BTreeSet<String>,
) -> anyhow::Result<BTreeMap<String, String>> {
    let api = Api::<Node>::all(client.clone());
    let mut hostnames = Vec::new();
    for n in nodes {
        let node = api.get(n).await?;
        let labels = node.metadata.labels.unwrap_or_default();
        hostnames.push(
            labels
                .get("kubernetes.io/hostname")
                .cloned()
                .unwrap_or_default(),
        );
    }
    let mut d = spec.deployment_json();
    d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"] = json!({
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
            "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                "values": hostnames}]}]}});
    Api::<Deployment>::namespaced(client.clone(), &spec.namespace)
        .patch(
            &spec.name,
            &PatchParams::apply("ebb-e2e").force(),
            &Patch::Apply(d),
        )
        .await?;
    let pods = Api::<Pod>::namespaced(client.clone(), &spec.namespace);
    let lp = ListParams::default().labels(&format!("app={}", spec.name));
    wait_for(
        &format!("{} {} pods running", spec.nodes, spec.name),
        spec.timeout,
        || async {
            let l = pods.list(&lp).await.ok()?.items;
            let running: BTreeMap<String, String> = l
                .iter()
                .filter(|p| is_running(p))
                .map(|p| {
                    let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                    (
                        p.metadata.name.clone().unwrap_or_default(),
                        node.unwrap_or_default(),
                    )
                })
                .collect();
            (l.len() == spec.nodes && running.len() == spec.nodes).then_some(running)
        },
    )
    .await
}

/// The Nodes of NodePool `pool` (`None` when the API server does not answer).
async fn pool_nodes(client: &kube::Client, pool: &str) -> Option<BTreeSet<String>> {
    let l = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{NODEPOOL_LABEL}={pool}")))
        .await
        .ok()?;
    Some(
        l.items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect(),
    )
}

#[derive(Default)]
struct StatusLogInner {
    /// Per node, the last removal entry seen in `drainingNodes`.
    removals: BTreeMap<String, RemovalStatus>,
    /// Per node, the drain phases seen, in order (repeats folded).
    phases: BTreeMap<String, Vec<DrainPhase>>,
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
                        let phases = g.phases.entry(d.node.clone()).or_default();
                        if phases.last() != Some(&d.phase) {
                            phases.push(d.phase);
                        }
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

    fn phases(&self, node: &str) -> Vec<DrainPhase> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .phases
            .get(node)
            .cloned()
            .unwrap_or_default()
    }
}
