//! The pace of a scale-down: drains follow a PodDisruptionBudget as replacements become Ready,
//! not the scan, and evictions follow the replacements the cluster is still starting
//! (`--max-starting-replacements`). How fast that is, is measured by the makespan and versus
//! benches.

use std::collections::BTreeSet;
use std::time::Duration;

use ebb_api::ScaleDownPolicy;
use ebb_e2e::AuditRecord;
use ebb_e2e::harness::{Backend, wait_for};
use ebb_e2e::pdb_safety;
use ebb_e2e::setup::{
    Apps, Cluster, Controller, DEFAULT_RECHECK, NodeGroup, PodLog, PodSeen, controller_audit_user,
    cpu_seconds, create_policy, fast_policy_spec, merged, node_of, nodes, peak_unavailable,
    running_pods, wait_running,
};
use kube::api::Api;
use serde_json::json;

const CONTROLLER: &str = "ebb-controller";

fn accepted_eviction(r: &AuditRecord) -> bool {
    is_eviction(r) && r.code == 201
}

fn is_eviction(r: &AuditRecord) -> bool {
    r.resource == "pods" && r.subresource == "eviction" && r.verb == "create"
}

/// Seconds from the first accepted eviction in the audit log to the last.
fn eviction_span(audit: &[AuditRecord]) -> f64 {
    let times: Vec<jiff::Timestamp> = audit
        .iter()
        .filter(|r| accepted_eviction(r))
        .filter_map(|r| r.time.parse().ok())
        .collect();
    match (times.iter().min(), times.iter().max()) {
        (Some(first), Some(last)) => last.duration_since(*first).as_secs_f64(),
        _ => 0.0,
    }
}

/// The most pods of `seen` (created after `since`) that were created and not Running at the
/// same time.
fn most_starting_at_once(seen: &[PodSeen], since: std::time::Instant) -> usize {
    let mut edges: Vec<(std::time::Instant, i32)> = Vec::new();
    for p in seen {
        let Some(first) = p.first_seen.filter(|t| *t > since) else {
            continue;
        };
        edges.push((first, 1));
        if let Some(running) = p.running_at {
            edges.push((running, -1));
        }
    }
    // At the same instant a pod Running is counted before one created.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

ebb_e2e::on_both_backends! {

/// Evictions follow the replacements still starting: 6 nodes of 4 CPUs, one Deployment of 12
/// pods (250m, two per node) that become Running 3 s after they are bound, the controller with
/// `--max-starting-replacements 2`. The pool shrinks to the one node its pods need, and never
/// more than 2 replacements are created and not Running at once (10 evictions sent at once
/// would have 10); the bound is used (2 at once at some point).
async fn evictions_wait_while_the_bound_of_replacements_is_starting(backend) {
    let c = Cluster::start(backend, 20.0).await.unwrap();
    let env = &c.env;
    let (pods, _w) = PodLog::watch(&env.client);
    let pool = NodeGroup {
        prefix: "pool-",
        count: 6,
        cpu: "4",
        memory: "16Gi",
        labels: json!({"pool": "drain"}),
        taints: json!([]),
    };
    c.add_nodes(&pool).await.unwrap();
    c.add_apps(&Apps {
        prefix: "web-",
        replicas: 12,
        requests: json!({"cpu": "250m", "memory": "64Mi"}),
        ready_after: Some(Duration::from_secs(3)),
        ..Apps::default()
    })
    .await
    .unwrap();
    wait_running(&env.client, 12).await.unwrap();
    let mut ctl = Controller::spawn_with(
        env,
        CONTROLLER,
        false,
        DEFAULT_RECHECK,
        &["--max-starting-replacements", "2"],
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    create_policy(
        &env.client,
        "pool",
        merged(fast_policy_spec("drain"), &json!({"maxDrainParallelism": 5, "maxScaleDownParallelism": 5})),
    )
    .await
    .unwrap();
    let shrunk = wait_for("the pool down to one node", Duration::from_secs(180), || async {
        let left = nodes(&env.client).await.into_keys().filter(|n| n.starts_with("pool-")).count();
        (left == 1).then_some(())
    })
    .await;
    if let Err(e) = shrunk {
        let status = Api::<ScaleDownPolicy>::all(env.client.clone()).get_opt("pool").await.ok().flatten().and_then(|p| p.status);
        panic!("{e}; status: {}", serde_json::to_string_pretty(&status).unwrap_or_default());
    }
    wait_running(&env.client, 12).await.unwrap();
    let web: Vec<PodSeen> = pods
        .all()
        .into_iter()
        .filter(|(k, _)| k.starts_with("default/web-0-"))
        .map(|(_, p)| p)
        .collect();
    let moved = web.iter().filter(|p| p.first_seen.is_some_and(|t| t > t0)).count();
    assert!(moved >= 10, "the pods of the 5 removed nodes were replaced: {moved}");
    let most = most_starting_at_once(&web, t0);
    eprintln!("{moved} replacements, at most {most} starting at once, in {:.1} s", t0.elapsed().as_secs_f64());
    assert!(most <= 2, "{most} replacements created and not Running at once, over the bound of 2");
    assert_eq!(most, 2, "the bound is used: two replacements start together");
    let _ = ctl.kill().await;
}


/// The pace is the budget's, not the scan's: 24 nodes of 4 CPUs, one Deployment of 24 pods
/// (250m, one per node), a PodDisruptionBudget with maxUnavailable 2, `unneededTime` 5 s and
/// `maxDrainParallelism` 8, the controller at its defaults. The pool shrinks to the two nodes
/// its pods need, never with more than 2 of the pods unavailable, and evictions are not
/// refused: each waits for the budget instead. On the real control plane the evictions follow
/// the budget: their 11 rounds spread over less than the 10 scan intervals (100 s) a scale-down
/// paced by the scan would need. The loop count and the controller's CPU
/// time are printed (no busy loop while drains wait for the budget).
async fn a_pool_under_a_pdb_shrinks_as_fast_as_the_budget_allows(backend) {
    let c = Cluster::start(backend, 20.0).await.unwrap();
    let env = &c.env;
    let (pods, _w) = PodLog::watch(&env.client);
    let pool = NodeGroup {
        prefix: "pool-",
        count: 24,
        cpu: "4",
        memory: "16Gi",
        labels: json!({"pool": "drain"}),
        taints: json!([]),
    };
    c.add_nodes(&pool).await.unwrap();
    c.add_apps(&Apps {
        prefix: "web-",
        replicas: 24,
        requests: json!({"cpu": "250m", "memory": "64Mi"}),
        pdb: Some(json!({"maxUnavailable": 2})),
        ..Apps::default()
    })
    .await
    .unwrap();
    wait_running(&env.client, 24).await.unwrap();
    let spread: BTreeSet<String> = running_pods(&env.client).await.iter().map(node_of).collect();
    assert_eq!(spread.len(), 24, "one pod per node");

    // The controller at its defaults, as users run it.
    let mut ctl = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    let t0 = std::time::Instant::now();
    create_policy(
        &env.client,
        "pool",
        merged(fast_policy_spec("drain"), &json!({"unneededTime": "5s", "scanInterval": "10s", "maxDrainParallelism": 8,
               "maxScaleDownParallelism": 8, "evictionRetryInterval": "5s"})),
    )
    .await
    .unwrap();
    // 24 × 250m = 6 CPUs: two nodes of 4 hold them all: 5 s of unneeded time, then 22 drains
    // paced two at a time by the budget (about 30 s on an idle machine). The bound is for
    // liveness only, long enough for a loaded machine; the pace is asserted from the audit log
    // below, and measured by the makespan bench.
    let bound = Duration::from_secs(120);
    let shrunk = wait_for("the pool down to two nodes", bound, || async {
        let left = nodes(&env.client).await.into_keys().filter(|n| n.starts_with("pool-")).count();
        (left == 2).then_some(())
    })
    .await;
    let took = t0.elapsed();
    // The pace, for the output: when each eviction and each node deletion was accepted.
    let pace: Vec<String> = env.audit().unwrap()
        .iter()
        .filter(|r| {
            (accepted_eviction(r) || (r.resource == "nodes" && r.verb == "delete"))
                && (200..300).contains(&r.code)
        })
        .map(|r| format!("{} {} {}", r.time, r.verb, r.name))
        .collect();
    eprintln!("evictions and node deletions:\n  {}", pace.join("\n  "));
    if let Err(e) = shrunk {
        let status = Api::<ScaleDownPolicy>::all(env.client.clone()).get_opt("pool").await.ok().flatten().and_then(|p| p.status);
        panic!("{e}; status: {}", serde_json::to_string_pretty(&status).unwrap_or_default());
    }
    wait_running(&env.client, 24).await.unwrap();
    let loops = ctl.lines().iter().filter(|l| l.contains("loop done")).count();
    let cpu = ctl.child.id().and_then(cpu_seconds);
    eprintln!(
        "pool of 24 under maxUnavailable 2: 22 nodes removed in {:.1} s with {loops} loops, \
         controller CPU {cpu:?} s",
        took.as_secs_f64()
    );
    let changes = pods.changes();
    assert!(
        peak_unavailable(&changes, "default/web-0-", 24) <= 2,
        "never more than 2 of the budget's pods unavailable: {changes:?}"
    );
    let user = controller_audit_user(env, "pool").await.unwrap();
    let audit = env.audit().unwrap();
    let accepted = audit.iter().filter(|r| accepted_eviction(r)).count();
    let refused = audit.iter().filter(|r| is_eviction(r) && r.code == 429).count();
    match backend {
        // The scheduler follows the plan (steering): no replacement lands on a node drained
        // later, so no pod is moved twice.
        Backend::Real => assert_eq!(accepted, 22, "one eviction per removed node"),
        // ebb-sim calls no admission webhook: its scheduler places replacements by itself, some
        // on nodes drained later.
        Backend::Sim => assert!(accepted >= 22, "at least one eviction per removed node"),
    }
    assert!(refused <= 2, "evictions wait for the budget rather than being refused: {refused}");
    if matches!(backend, Backend::Real) {
        // ebb-sim's audit log is on its own clock (pods run 20 times faster), so the span is
        // read on the real control plane only.
        // Under maxUnavailable 2 the 22 evictions need 11 rounds; paced by the scan, the last
        // would come at least 10 scans (100 s) after the first. Paced by the budget, each round
        // follows the replacements of the last becoming Ready (about 2 s apart here).
        let span = eviction_span(&audit);
        assert!(
            span < 100.0,
            "the 22 evictions spread over {span:.1} s, 10 scan intervals or more: the scan, not \
             the budget, paced them"
        );
        eprintln!("the 22 evictions spread over {span:.1} s");
    }
    let api = Api::<ScaleDownPolicy>::all(env.client.clone());
    let status = wait_for("the refusals in status", Duration::from_secs(10), || async {
        let s = api.get_opt("pool").await.ok()??.status?;
        (s.removed_total == 22).then_some(s.evictions_refused_total)
    })
    .await
    .unwrap();
    assert_eq!(status, refused as i64, "status counts the refused evictions");
    // No busy loop: the drains waited for the budget without re-running the policy on a timer.
    assert!(loops < 200, "{loops} loops for 22 drains");
    let _ = ctl.kill().await;
    pdb_safety::assert_safe(env, &[&user]);
}

}
