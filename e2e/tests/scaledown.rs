//! The ScaleDownPolicy controller end to end: the real `ebb-controller run` binary against
//! ebb-sim and against a real control plane (kube-apiserver, controller-manager, scheduler,
//! kwok), judged from the API server's audit log, budgets, node taints and policy status.
//!
//! Every test runs on both backends (`<test>::sim`, `<test>::real`) and ends with the same
//! checks: no PodDisruptionBudget violated (`ebb_e2e::pdb_safety`), no pod deleted without the
//! Eviction API, no pod evicted twice, no Node deleted twice. On the real backend a pod's
//! grace period is the sim's 30 s of sim time in real time, and kwok's stage delays stand in
//! for the sim's scripted kubelet (start delays, pods that never become ready).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ebb_api::ScaleDownPolicy;
use ebb_api::reasons::UnremovableReason;
use ebb_e2e::AuditRecord;
use ebb_e2e::harness::{Backend, TestEnv, wait_for};
use ebb_e2e::pdb_safety;
use ebb_e2e::setup::{
    Apps, Cluster, Controller, DEFAULT_RECHECK, NodeGroup, PodChange, PodLog, TaintLog, bare_pod,
    controller_audit_user, create_policy, fast_policy_spec, has_taint, impersonating_kubeconfig,
    key, merged, node_of, nodes, peak_unavailable, running_pods, wait_running,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

const TO_BE_DELETED: &str = "ebb.dev/to-be-deleted";
const CANDIDATE: &str = "ebb.dev/deletion-candidate";
const CONTROLLER: &str = "ebb-controller";

// ---- set-up ------------------------------------------------------------------------------

async fn start(backend: Backend, time_factor: f64) -> Cluster {
    Cluster::start(backend, time_factor).await.unwrap()
}

/// `count` nodes `drain-<i>` of the retiring pool (selected by the policies; 2 CPUs, a
/// PreferNoSchedule taint of their own so that replacements go elsewhere).
fn drain_nodes(count: usize) -> NodeGroup<'static> {
    NodeGroup::retiring("drain-", count, "drain")
}

fn keep_nodes(count: usize, cpu: &'static str, memory: &'static str) -> NodeGroup<'static> {
    NodeGroup {
        prefix: "keep-",
        count,
        cpu,
        memory,
        labels: json!({"pool": "keep"}),
        taints: json!([]),
    }
}

/// A small cluster for most tests: `drain` nodes of the retiring pool filled by `apps`
/// Deployments of `replicas` pods (500m each), with `pdb` each when given.
async fn small_cluster(c: &Cluster, drain: usize, apps: usize, replicas: i64, pdb: Option<Value>) {
    // Every node ready first, so the pods spread evenly.
    c.add_nodes(&drain_nodes(drain)).await.unwrap();
    c.add_apps(&Apps {
        count: apps,
        replicas,
        pdb,
        ..Apps::default()
    })
    .await
    .unwrap();
    wait_running(c.client(), apps * replicas as usize)
        .await
        .unwrap();
}

/// Two large `keep-` nodes that can take every pod.
async fn add_keep_nodes(c: &Cluster) {
    c.add_nodes(&keep_nodes(2, "32", "128Gi")).await.unwrap();
}

/// A ScaleDownPolicy on nodes labelled `pool: drain`, acting fast; `extra` overrides the spec.
async fn apply_policy(client: &kube::Client, name: &str, extra: Value) {
    create_policy(client, name, merged(fast_policy_spec("drain"), &extra))
        .await
        .unwrap();
}

async fn policy(client: &kube::Client, name: &str) -> Option<ScaleDownPolicy> {
    Api::<ScaleDownPolicy>::all(client.clone())
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

fn names(prefix: &str, count: usize) -> BTreeSet<String> {
    (0..count).map(|i| format!("{prefix}{i}")).collect()
}

fn ebb_tainted(all: &BTreeMap<String, Node>) -> Vec<String> {
    all.iter()
        .filter(|(_, n)| has_taint(n, TO_BE_DELETED) || has_taint(n, CANDIDATE))
        .map(|(name, _)| name.clone())
        .collect()
}

/// Starts the controller with the `pool` policy (utilization threshold 0.6) and waits until
/// none of `gone` exists any more.
async fn run_pool_policy(env: &TestEnv, gone: &BTreeSet<String>, timeout: Duration) -> Controller {
    let ctl = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    apply_policy(&env.client, "pool", json!({"utilizationThreshold": 0.6})).await;
    wait_nodes_deleted(&env.client, "pool", gone, timeout).await;
    ctl
}

/// Waits until none of `gone` exists any more; on timeout fails showing the policy's status.
async fn wait_nodes_deleted(
    client: &kube::Client,
    policy_name: &str,
    gone: &BTreeSet<String>,
    timeout: Duration,
) {
    let r = wait_for(
        &format!("{} nodes deleted", gone.len()),
        timeout,
        || async {
            let now = nodes(client).await;
            (!now.is_empty() && gone.iter().all(|n| !now.contains_key(n))).then_some(())
        },
    )
    .await;
    if let Err(e) = r {
        let status = policy(client, policy_name).await.and_then(|p| p.status);
        let all = nodes(client).await;
        let left: Vec<String> = all.keys().filter(|n| gone.contains(*n)).cloned().collect();
        for n in &left {
            eprintln!(
                "NODE {n} taints {:?} unsched {:?}",
                all[n].spec.as_ref().and_then(|s| s.taints.clone()),
                all[n].spec.as_ref().and_then(|s| s.unschedulable)
            );
        }
        let pods: Api<Pod> = Api::all(client.clone());
        for p in pods
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            if left.contains(&node_of(&p)) {
                eprintln!(
                    "POD {} on {} phase {:?} del {:?} conds {:?}",
                    key(&p),
                    node_of(&p),
                    p.status.as_ref().and_then(|s| s.phase.clone()),
                    p.metadata.deletion_timestamp,
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.clone())
                        .map(|c| c
                            .iter()
                            .map(|c| format!("{}={}", c.type_, c.status))
                            .collect::<Vec<_>>())
                );
            }
        }
        panic!(
            "{e}; left: {left:?}; status of {policy_name}: {}",
            serde_json::to_string_pretty(&status).unwrap_or_default()
        );
    }
}

/// Waits until the policy's status counts `n` nodes removed (and fails if it counts more).
async fn wait_removed(client: &kube::Client, name: &str, n: i64) {
    let got = wait_for(
        &format!("status.removedTotal of {name} at {n}"),
        Duration::from_secs(20),
        || async {
            let r = policy(client, name).await?.status?.removed_total;
            (r >= n).then_some(r)
        },
    )
    .await
    .unwrap();
    assert_eq!(got, n, "status.removedTotal");
}

/// Waits until the policy's status satisfies `check`; on timeout fails showing the status.
async fn wait_status<T>(
    client: &kube::Client,
    name: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&ebb_api::ScaleDownPolicyStatus) -> Option<T>,
) -> T {
    let check = &check;
    let r = wait_for(what, timeout, || async move {
        check(&policy(client, name).await?.status?)
    })
    .await;
    match r {
        Ok(v) => v,
        Err(e) => {
            let status = policy(client, name).await.and_then(|p| p.status);
            panic!(
                "{e}; status of {name}: {}",
                serde_json::to_string_pretty(&status).unwrap_or_default()
            )
        }
    }
}

fn audit(env: &TestEnv) -> Vec<AuditRecord> {
    env.audit().unwrap()
}

/// Waits until the audit log shows a record satisfying `check`.
async fn wait_audit(
    env: &TestEnv,
    what: &str,
    timeout: Duration,
    check: impl Fn(&AuditRecord) -> bool,
) -> AuditRecord {
    let check = &check;
    wait_for(what, timeout, || async move {
        env.audit().ok()?.into_iter().find(|r| check(r))
    })
    .await
    .unwrap()
}

// ---- reading the audit log ---------------------------------------------------------------

fn is_eviction(r: &AuditRecord) -> bool {
    r.resource == "pods" && r.subresource == "eviction" && r.verb == "create"
}

fn accepted_eviction(r: &AuditRecord) -> bool {
    is_eviction(r) && r.code == 201
}

/// Writes to nodes, or to pods and their subresources, by `user`.
fn node_or_pod_writes<'a>(audit: &'a [AuditRecord], user: &str) -> Vec<&'a AuditRecord> {
    audit
        .iter()
        .filter(|r| r.user == user && (r.resource == "nodes" || r.resource == "pods"))
        .collect()
}

/// Per node: the audit positions of its first accepted eviction and of its deletion (or the
/// last record when it was not deleted).
fn drain_intervals(audit: &[AuditRecord], pods: &PodLog) -> BTreeMap<String, (usize, usize)> {
    let mut first: BTreeMap<String, usize> = BTreeMap::new();
    for (i, r) in audit.iter().enumerate() {
        if accepted_eviction(r)
            && let Some(node) = pods.node(&format!("{}/{}", r.namespace, r.name))
        {
            first.entry(node).or_insert(i);
        }
    }
    first
        .into_iter()
        .map(|(node, start)| {
            let end = audit
                .iter()
                .enumerate()
                .skip(start)
                .find(|(_, r)| r.resource == "nodes" && r.verb == "delete" && r.name == node)
                .map_or(audit.len(), |(i, _)| i);
            (node, (start, end))
        })
        .collect()
}

/// The most drains whose intervals contain one audit position.
fn peak_overlap(intervals: &BTreeMap<String, (usize, usize)>) -> usize {
    let mut edges: Vec<(usize, i32)> = Vec::new();
    for (s, e) in intervals.values() {
        edges.push((*s, 1));
        edges.push((*e, -1));
    }
    // Ends before starts at one position: touching intervals do not overlap.
    edges.sort_by_key(|(at, d)| (*at, *d));
    let (mut open, mut peak) = (0i32, 0i32);
    for (_, d) in edges {
        open += d;
        peak = peak.max(open);
    }
    peak as usize
}

#[test]
fn overlap_is_counted_from_intervals() {
    let iv: BTreeMap<String, (usize, usize)> = [("a", (0, 5)), ("b", (3, 8)), ("c", (5, 9))]
        .into_iter()
        .map(|(n, i)| (n.to_string(), i))
        .collect();
    assert_eq!(peak_overlap(&iv), 2);
    let apart: BTreeMap<String, (usize, usize)> = [("a", (0, 2)), ("b", (2, 4))]
        .into_iter()
        .map(|(n, i)| (n.to_string(), i))
        .collect();
    assert_eq!(peak_overlap(&apart), 1);
}

/// Pods (`namespace/name`) accepted for eviction more than once.
fn evicted_twice(audit: &[AuditRecord]) -> BTreeMap<String, usize> {
    let mut n: BTreeMap<String, usize> = BTreeMap::new();
    for r in audit.iter().filter(|r| accepted_eviction(r)) {
        *n.entry(format!("{}/{}", r.namespace, r.name)).or_insert(0) += 1;
    }
    n.retain(|_, c| *c > 1);
    n
}

#[test]
fn a_second_accepted_eviction_of_a_pod_is_found() {
    let rec = |name: &str, code: u16| AuditRecord {
        time: String::new(),
        user: "u".into(),
        verb: "create".into(),
        resource: "pods".into(),
        subresource: "eviction".into(),
        namespace: "default".into(),
        name: name.into(),
        code,
    };
    let log = vec![rec("a", 201), rec("b", 429), rec("b", 201), rec("a", 201)];
    assert_eq!(
        evicted_twice(&log),
        BTreeMap::from([("default/a".to_string(), 2)])
    );
}

/// The checks every scale-down test ends with, on either backend, for the controller's
/// audit identities `users`: no PodDisruptionBudget violated, no pod deleted without the
/// Eviction API, no pod evicted twice, no Node deleted twice.
fn assert_scaledown_safe(env: &TestEnv, users: &[&str]) {
    pdb_safety::assert_safe(env, users);
    let audit = audit(env);
    let direct: Vec<&AuditRecord> = audit
        .iter()
        .filter(|r| {
            users.contains(&r.user.as_str())
                && r.resource == "pods"
                && r.subresource.is_empty()
                && r.verb == "delete"
        })
        .collect();
    assert!(
        direct.is_empty(),
        "pods deleted without the Eviction API: {direct:?}"
    );
    let twice = evicted_twice(&audit);
    assert!(twice.is_empty(), "pods evicted more than once: {twice:?}");
    let mut node_deletes: BTreeMap<&str, usize> = BTreeMap::new();
    for r in audit.iter().filter(|r| {
        users.contains(&r.user.as_str())
            && r.resource == "nodes"
            && r.verb == "delete"
            && (200..300).contains(&r.code)
    }) {
        *node_deletes.entry(r.name.as_str()).or_insert(0) += 1;
    }
    node_deletes.retain(|_, n| *n > 1);
    assert!(
        node_deletes.is_empty(),
        "Nodes deleted twice: {node_deletes:?}"
    );
}

// ---- planner fidelity --------------------------------------------------------------------

/// `pod → destination` from the controller's "planned destination" log lines.
fn planned_destinations(lines: &[String]) -> BTreeMap<String, String> {
    let field = |l: &str, k: &str| {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .map(|v| v.trim_matches('"').to_string())
    };
    lines
        .iter()
        .filter(|l| l.contains("planned destination"))
        .filter_map(|l| Some((field(l, "pod")?, field(l, "to")?)))
        .collect()
}

#[test]
fn planned_destinations_are_read_from_the_log() {
    let lines = vec![
        "2026-11-23T10:00:00Z  INFO loop{policy=pool}: ebb_controller::reconcilers::scaledown::reconcile: planned destination node=drain-0 pod=default/app-0-x-y to=keep-1".to_string(),
        "something else pod=a to=b".to_string(),
    ];
    assert_eq!(
        planned_destinations(&lines),
        BTreeMap::from([("default/app-0-x-y".to_string(), "keep-1".to_string())])
    );
}

/// After a scale-down: where the scheduler put each evicted pod's replacement against the
/// planner's destination hint. Prints the share that matched and a reason for each mismatch;
/// asserts every evicted pod's owner runs whole again off `removed`, and that no replacement
/// was Pending longer than `pending_bound`.
async fn fidelity(
    c: &Cluster,
    ctl: &Controller,
    pods: &PodLog,
    removed: &BTreeSet<String>,
    pending_bound: Duration,
) {
    let audit = audit(&c.env);
    let plan = planned_destinations(&ctl.lines());
    let seen = pods.all();
    let evicted: Vec<String> = audit
        .iter()
        .filter(|r| accepted_eviction(r))
        .map(|r| format!("{}/{}", r.namespace, r.name))
        .collect();
    // Per owner: the hinted nodes of its evicted pods, and the nodes its replacements ran on.
    let mut hinted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut no_hint = Vec::new();
    for p in &evicted {
        let Some(owner) = seen.get(p).and_then(|s| s.owner.clone()) else {
            continue;
        };
        match plan.get(p) {
            Some(to) => hinted.entry(owner).or_default().push(to.clone()),
            None => no_hint.push(p.clone()),
        }
    }
    let now = running_pods(c.client()).await;
    let mut matched = 0usize;
    let mut total = 0usize;
    let mut mismatches = Vec::new();
    let final_nodes = nodes(c.client()).await;
    let requested = |node: &str| -> i64 {
        now.iter()
            .filter(|p| node_of(p) == node)
            .filter_map(|p| seen.get(&key(p)))
            .map(|s| s.requests_cpu_milli)
            .sum()
    };
    for (owner, hints) in &hinted {
        // Replacements: pods of the owner that were not evicted, first seen after the first
        // eviction of its pods, in order of appearance.
        let mut actual: Vec<(std::time::Instant, String)> = seen
            .iter()
            .filter(|(k, s)| s.owner.as_ref() == Some(owner) && !evicted.contains(*k))
            .filter(|(_, s)| !s.node.is_empty())
            .filter_map(|(_, s)| Some((s.first_seen?, s.node.clone())))
            .collect();
        actual.sort();
        let recent: Vec<String> = actual
            .iter()
            .rev()
            .take(hints.len())
            .map(|(_, n)| n.clone())
            .collect();
        let mut left: Vec<String> = recent.clone();
        let mut unmatched_hints = Vec::new();
        for h in hints {
            total += 1;
            if let Some(i) = left.iter().position(|n| n == h) {
                left.remove(i);
                matched += 1;
            } else {
                unmatched_hints.push(h.clone());
            }
        }
        for (h, a) in unmatched_hints.iter().zip(left.iter()) {
            let why = if removed.contains(h) {
                format!(
                    "the hint named {h}, a node of the retiring pool (removed later in this \
                     scale-down): the planner packs pods onto the fullest node that fits, the \
                     scheduler scores {h}'s PreferNoSchedule taints (`retiring`, ebb's \
                     deletion-candidate) down and its LeastAllocated score prefers the emptier {a}"
                )
            } else if !final_nodes.contains_key(h) {
                format!("the hinted node {h} was removed since")
            } else if removed.contains(a) || a.starts_with("drain-") {
                format!(
                    "the scheduler chose {a}, a node of the retiring pool (its taints are only \
                     PreferNoSchedule), over the hinted {h}"
                )
            } else {
                format!(
                    "the scheduler's scoring chose {a} ({}m CPU requested there now) over the \
                     hinted {h} ({}m): the planner packs the fullest node that fits, the \
                     scheduler's default LeastAllocated score spreads",
                    requested(a),
                    requested(h)
                )
            };
            mismatches.push(format!("{owner}: hint {h}, placed on {a}: {why}"));
        }
    }
    let share = if total == 0 {
        0.0
    } else {
        matched as f64 / total as f64
    };
    eprintln!(
        "PLANNER FIDELITY ({:?}): {matched} of {total} evicted pods' replacements ran on the \
         node the planner's destination hint named ({:.0}%); {} evicted pods had no hint logged",
        c.backend(),
        share * 100.0,
        no_hint.len()
    );
    for m in &mismatches {
        eprintln!("  mismatch: {m}");
    }
    assert!(
        total > 0,
        "the planner logged destinations for the evicted pods"
    );
    if c.backend() == Backend::Real {
        // The real cluster runs the steering webhook (the harness's controllers serve it): the
        // scheduler follows the plan.
        assert!(
            share >= 0.95,
            "at least 95% of the replacements run on their planned node: {matched} of {total}; \
             misses: {mismatches:#?}"
        );
        let api: Api<ScaleDownPolicy> = Api::all(c.client().clone());
        let status = wait_for(
            "status.replacements counts the landings",
            Duration::from_secs(30),
            || async {
                let r = api.get("pool").await.ok()?.status?.replacements?;
                (r.on_plan + r.fell_back >= total as i64).then_some(r)
            },
        )
        .await
        .unwrap();
        eprintln!("status.replacements: {status:?}");
        assert_eq!(status.steering, "Enabled", "{status:?}");
        assert!(
            status.on_plan_percent.is_some_and(|p| p >= 95),
            "the controller's own count agrees: {status:?}"
        );
    }

    // Every evicted pod's owner is whole again, Running on nodes that stay.
    for owner in hinted.keys() {
        let on: Vec<&Pod> = now
            .iter()
            .filter(|p| seen.get(&key(p)).and_then(|s| s.owner.as_ref()) == Some(owner))
            .collect();
        assert!(!on.is_empty(), "{owner} runs again");
        for p in on {
            assert!(
                !removed.contains(&node_of(p)) && final_nodes.contains_key(&node_of(p)),
                "{} of {owner} runs on {}, a node that was not removed",
                key(p),
                node_of(p)
            );
        }
    }
    // No replacement stayed Pending longer than it takes to start, plus a few seconds.
    let mut slow = Vec::new();
    for (k, s) in &seen {
        if evicted.contains(k) || !hinted.contains_key(s.owner.as_deref().unwrap_or("")) {
            continue;
        }
        if let (Some(a), Some(b)) = (s.first_seen, s.running_at)
            && b.duration_since(a) > pending_bound
        {
            slow.push(format!("{k} pending {:?}", b.duration_since(a)));
        }
    }
    assert!(
        slow.is_empty(),
        "replacements pending longer than {pending_bound:?}: {slow:?}"
    );
}

// ---- the tests ---------------------------------------------------------------------------

ebb_e2e::on_both_backends! {

/// 1. Underutilised nodes (60 on ebb-sim, 24 on the real control plane: the point — drains
/// overlapping up to the limit — holds with fewer, and 2 cores serve the whole suite),
/// maxDrainParallelism 10: every removable node goes, drains overlap (never more than 10 at
/// once), no PDB is violated, every evicted pod runs elsewhere; on both backends the planner's
/// destination hints are compared with where the scheduler put the replacements.
async fn sixty_underutilised_nodes_drain_in_parallel(backend) {
    let c = start(backend, 20.0).await;
    let env = &c.env;
    let drain_count = if backend == Backend::Sim { 60 } else { 24 };
    let apps = drain_count / 2;
    let (pods, _w) = PodLog::watch(&env.client);
    // `apps` × 4 pods of 500m (each with a PDB) fill the small nodes two pods each; then 4 large
    // nodes, not selected by the policy, join: they can hold every pod. The small pool is being
    // retired (a PreferNoSchedule taint of its own), so replacements go to the large nodes.
    c.add_nodes(&drain_nodes(drain_count)).await.unwrap();
    c.add_apps(&Apps {
        count: apps,
        replicas: 4,
        pdb: Some(json!({"maxUnavailable": 1})),
        ..Apps::default()
    })
    .await
    .unwrap();
    wait_running(&env.client, apps * 4).await.unwrap();
    c.add_nodes(&keep_nodes(4, "64", "256Gi")).await.unwrap();
    let on_drain = running_pods(&env.client).await.len();

    let drain = names("drain-", drain_count);
    let ctl = run_pool_policy(env, &drain, Duration::from_secs(120)).await;
    let user = controller_audit_user(env, "pool").await.unwrap();

    let audit = audit(env);
    let intervals = drain_intervals(&audit, &pods);
    let peak = peak_overlap(&intervals);
    assert!(peak >= 2, "drains overlap in time (peak {peak})");
    assert!(
        peak <= 10,
        "at most maxDrainParallelism drains at once (peak {peak})"
    );

    // Every evicted pod's app is whole again, on the nodes that stay.
    wait_running(&env.client, apps * 4).await.unwrap();
    let after = running_pods(&env.client).await;
    let evicted: Vec<&AuditRecord> = audit.iter().filter(|r| accepted_eviction(r)).collect();
    assert!(evicted.len() >= on_drain, "{} evictions", evicted.len());
    for r in evicted {
        assert_eq!(r.user, user);
        let app = r
            .name
            .rsplitn(3, '-')
            .nth(2)
            .unwrap_or_default()
            .to_string();
        let running: Vec<&Pod> = after
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&format!("{app}-")))
            })
            .collect();
        assert_eq!(
            running.len(),
            4,
            "app {app} of evicted pod {} is whole",
            r.name
        );
        assert!(
            running.iter().all(|p| node_of(p).starts_with("keep-")),
            "app {app} runs on the remaining nodes"
        );
    }
    wait_removed(&env.client, "pool", drain_count as i64).await;
    // A replacement starts within kwok's two pod stages (up to 0.5 s each) or the sim's 1 s of
    // sim time; a few seconds more are allowed for the scheduler and the watch.
    fidelity(&c, &ctl, &pods, &drain, Duration::from_secs(6)).await;
    assert_scaledown_safe(env, &[&user]);
}

/// 1b. Drains wait for the soft taints. Four under-used nodes of a pool with no taint of its own
/// and `maxBulkSoftTaintCount: 1`: the candidates are marked one a loop, and no node shows the
/// to-be-deleted taint (no pod is evicted) before every removed node showed
/// `ebb.dev/deletion-candidate`. A drain started earlier would send its pods' replacements to
/// the unmarked candidates, the emptiest nodes, which would then be held as
/// `DestinationOfMovedPods`.
async fn drains_wait_until_every_candidate_carries_the_soft_taint(backend) {
    let c = start(backend, 20.0).await;
    let env = &c.env;
    let spare = NodeGroup {
        labels: json!({"pool": "drain"}),
        ..NodeGroup::plain("spare-", 4, "2", "8Gi")
    };
    c.add_nodes(&spare).await.unwrap();
    c.add_apps(&Apps {
        count: 2,
        replicas: 2,
        ..Apps::default()
    })
    .await
    .unwrap();
    wait_running(&env.client, 4).await.unwrap();
    add_keep_nodes(&c).await;
    let (taints, _w) = TaintLog::watch(&env.client);
    let spares = names("spare-", 4);
    let _ctl = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    apply_policy(
        &env.client,
        "pool",
        json!({"maxBulkSoftTaintCount": 1, "maxDrainParallelism": 4}),
    )
    .await;
    wait_nodes_deleted(&env.client, "pool", &spares, Duration::from_secs(120)).await;
    let soft = taints.first_shown(CANDIDATE);
    let hard = taints.first_shown(TO_BE_DELETED);
    let first_drain = hard.values().min().copied();
    let first_drain = first_drain.expect("the removed nodes were drained (to-be-deleted taint)");
    for node in &spares {
        let marked = soft.get(node).copied();
        assert!(
            marked.is_some_and(|m| m < first_drain),
            "{node} showed the soft taint (event {marked:?}) before the first drain (event \
             {first_drain}); soft {soft:?}, to-be-deleted {hard:?}"
        );
    }
    let user = controller_audit_user(env, "pool").await.unwrap();
    assert_scaledown_safe(env, &[&user]);
}

/// 2. A PodDisruptionBudget that allows no disruption yet: the drains start, but their evictions
/// are not sent until the budget allows them (no refusal to retry), the budget is never exceeded,
/// and the drains complete.
///
/// Two never-ready pods (evictable only while the budget is met, as the API server decides) on
/// the two nodes, and the budget's other pods still starting when the drains begin: a drain's
/// pacing counts healthy pods only, so the drains start at once and the evictions wait.
async fn evictions_wait_until_the_budget_allows(backend) {
    let c = start(backend, 20.0).await;
    let env = &c.env;
    let (pods, _w) = PodLog::watch(&env.client);
    let pods_api: Api<Pod> = Api::all(env.client.clone());
    c.add_nodes(&drain_nodes(2)).await.unwrap();
    c.add_apps(&Apps {
        prefix: "flaky-",
        replicas: 2,
        labels: json!({"tier": "web"}),
        requests: json!({"cpu": "500m"}),
        never_ready: true,
        ..Apps::default()
    })
    .await
    .unwrap();
    wait_for(
        "2 pods started (never ready)",
        Duration::from_secs(30),
        || async {
            let l = pods_api
                .list(&ListParams::default().fields("status.phase=Running"))
                .await
                .ok()?;
            let on: BTreeSet<String> = l.items.iter().map(node_of).collect();
            (on.len() == 2).then_some(())
        },
    )
    .await
    .unwrap();
    // Three more pods of the budget start on the large nodes; they take 10 s to be ready
    // (200 s of sim time): the drains begin well before.
    c.create_pdb(json!({"metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 3, "selector": {"matchLabels": {"tier": "web"}}}}))
        .await
        .unwrap();
    c.add_nodes(&keep_nodes(2, "32", "128Gi")).await.unwrap();
    c.add_apps(&Apps {
        prefix: "web-",
        replicas: 3,
        labels: json!({"tier": "web"}),
        requests: json!({"cpu": "500m"}),
        ready_after: Some(Duration::from_secs(10)),
        ..Apps::default()
    })
    .await
    .unwrap();
    let _ctl = run_pool_policy(env, &names("drain-", 2), Duration::from_secs(60)).await;
    let user = controller_audit_user(env, "pool").await.unwrap();

    let audit = audit(env);
    let evictions: Vec<&AuditRecord> = audit.iter().filter(|r| is_eviction(r)).collect();
    let refused = evictions.iter().filter(|r| r.code == 429).count();
    let accepted: Vec<&&AuditRecord> = evictions.iter().filter(|r| r.code == 201).collect();
    assert!(
        refused <= 1,
        "evictions wait for the budget instead of being refused: {evictions:?}"
    );
    assert_eq!(accepted.len(), 2, "each pod evicted once: {accepted:?}");
    assert!(
        evictions
            .iter()
            .all(|r| r.user == user && r.name.starts_with("flaky-0-")),
        "{evictions:?}"
    );
    // Accepted only once the budget's other three pods were ready: in the API server's order
    // (one watch of all pods), the three web pods were Ready before a flaky pod terminated.
    let changes = pods.changes();
    let first_gone = changes
        .iter()
        .position(|c| matches!(c, PodChange::Terminating(p) if p.starts_with("default/flaky-0-")))
        .expect("a flaky pod was seen terminating");
    let web_ready: BTreeSet<&String> = changes[..first_gone]
        .iter()
        .filter_map(|c| match c {
            PodChange::Ready(p) if p.starts_with("default/web-0-") => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(
        web_ready.len(),
        3,
        "the web pods started before an eviction was accepted: {changes:?}"
    );
    wait_removed(&env.client, "pool", 2).await;
    assert_scaledown_safe(env, &[&user]);
}

/// 2b. A PodDisruptionBudget with maxUnavailable 1 over pods spread one per node: the planner
/// counts the budget, so the pods are evicted one after the other (the next once the last one's
/// replacement is Ready) without a refused eviction, the budget is never exceeded, and all of
/// the nodes go. (A drain may still be waiting for its node's deletion when the next one evicts:
/// the budget allows that once the replacement is Ready.)
async fn pdb_max_unavailable_one_drains_its_nodes_one_at_a_time(backend) {
    let c = start(backend, 20.0).await;
    let env = &c.env;
    let (pods, _w) = PodLog::watch(&env.client);
    small_cluster(&c, 4, 1, 4, Some(json!({"maxUnavailable": 1}))).await;
    let spread: BTreeSet<String> = running_pods(&env.client)
        .await
        .iter()
        .map(node_of)
        .collect();
    assert_eq!(spread.len(), 4, "one pod per node");
    add_keep_nodes(&c).await;
    let _ctl = run_pool_policy(env, &names("drain-", 4), Duration::from_secs(60)).await;
    let user = controller_audit_user(env, "pool").await.unwrap();
    let audit = audit(env);
    let evictions: Vec<&AuditRecord> = audit.iter().filter(|r| is_eviction(r)).collect();
    assert_eq!(
        evictions.iter().filter(|r| r.code == 201).count(),
        4,
        "{evictions:?}"
    );
    assert!(
        evictions.iter().all(|r| r.code == 201),
        "the planner never asked more than the budget allows: {evictions:?}"
    );
    let changes = pods.changes();
    assert_eq!(
        peak_unavailable(&changes, "default/app-0-", 4),
        1,
        "one pod of the budget unavailable at a time: {changes:?}"
    );
    wait_removed(&env.client, "pool", 4).await;
    assert_scaledown_safe(env, &[&user]);
}

/// 3. A node whose pod cannot move (no controller) is never tainted to-be-deleted and shows in
/// status with the reason; its neighbours go.
async fn unmovable_pod_keeps_its_node(backend) {
    let c = start(backend, 20.0).await;
    let env = &c.env;
    small_cluster(&c, 3, 1, 3, None).await;
    bare_pod(&env.client, "pinned", "drain-1").await.unwrap();
    wait_running(&env.client, 4).await.unwrap();
    add_keep_nodes(&c).await;
    let gone: BTreeSet<String> = ["drain-0", "drain-2"].map(String::from).into();
    let _ctl = run_pool_policy(env, &gone, Duration::from_secs(40)).await;
    let user = controller_audit_user(env, "pool").await.unwrap();

    // Once its neighbours are gone it is no destination for their pods any more, and the
    // status names the pod that blocks it.
    let blocked = wait_status(
        &env.client,
        "pool",
        "drain-1 reported blocked by its pod",
        Duration::from_secs(10),
        |s| {
            s.unremovable_nodes
                .iter()
                .find(|u| u.node == "drain-1" && u.reason == UnremovableReason::BlockedByPod)
                .cloned()
        },
    )
    .await;
    assert_eq!(blocked.pod.as_deref(), Some("default/pinned"));
    assert_eq!(
        blocked.pod_reason,
        Some(ebb_api::reasons::BlockingPodReason::NotReplicated)
    );
    let all = nodes(&env.client).await;
    assert!(all.contains_key("drain-1"));
    assert!(!has_taint(&all["drain-1"], TO_BE_DELETED));
    let audit = audit(env);
    let writes: Vec<&AuditRecord> = node_or_pod_writes(&audit, &user)
        .into_iter()
        .filter(|r| r.resource == "nodes" && r.name == "drain-1")
        .collect();
    assert!(
        writes.is_empty(),
        "the controller never wrote drain-1: {writes:?}"
    );

    // One NodeRemoved Event per removed node on the policy, each naming its node (repeats with
    // the same related object would fold into one series that keeps the first note).
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(env.client.clone());
    let removed_events = || async {
        events
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("NodeRemoved"))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("pool"))
            .map(|e| {
                let node = e
                    .related
                    .and_then(|r| r.name)
                    .unwrap_or_else(|| "<no related object>".into());
                (node, e.note.unwrap_or_default())
            })
            .collect::<BTreeMap<String, String>>()
    };
    // The last node's Event is written by the loop after its deletion.
    let _ = wait_for("a NodeRemoved Event per node", Duration::from_secs(10), || async {
        (removed_events().await.len() >= gone.len()).then_some(())
    })
    .await;
    let removed = removed_events().await;
    assert_eq!(
        removed.keys().cloned().collect::<BTreeSet<_>>(),
        gone,
        "{removed:?}"
    );
    for (node, note) in &removed {
        assert!(note.contains(&format!("node {node} removed")), "{note}");
    }
    assert_scaledown_safe(env, &[&user]);
}

/// 4. The controller is killed (SIGKILL) mid-drain and started again, and that one is killed
/// right after removing a node: the drains complete, no ebb taint is left, and the removed
/// count is right.
async fn sigkill_mid_drain_then_restart_completes(backend) {
    // Evicted pods take their grace period of 30 s sim time: 3 s of real time.
    let c = start(backend, 10.0).await;
    let env = &c.env;
    small_cluster(&c, 4, 2, 4, None).await;
    add_keep_nodes(&c).await;
    let mut first = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    apply_policy(&env.client, "pool", json!({"utilizationThreshold": 0.6})).await;
    wait_audit(env, "a first eviction", Duration::from_secs(30), accepted_eviction).await;
    // Killed once it has reported (its status lists the drains in flight, which is what the
    // next process counts removals from): drains start before a loop's status write.
    let user = controller_audit_user(env, "pool").await.unwrap();
    first.kill().await.unwrap();
    let all = nodes(&env.client).await;
    let stuck: Vec<&String> = all
        .iter()
        .filter(|(_, n)| has_taint(n, TO_BE_DELETED))
        .map(|(k, _)| k)
        .collect();
    assert!(!stuck.is_empty(), "the kill left drains in flight");
    assert_eq!(all.len(), 6, "no node was removed before the kill");

    // The second one is killed right after it removed a node (before the next status write).
    let mut second = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    let u = user.clone();
    wait_audit(env, "a first node deleted", Duration::from_secs(30), move |r| {
        r.user == u && r.resource == "nodes" && r.verb == "delete"
    })
    .await;
    second.kill().await.unwrap();
    let _third = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    wait_nodes_deleted(
        &env.client,
        "pool",
        &names("drain-", 4),
        Duration::from_secs(60),
    )
    .await;
    let left = nodes(&env.client).await;
    assert!(
        ebb_tainted(&left).is_empty(),
        "no ebb taint left: {:?}",
        ebb_tainted(&left)
    );
    wait_removed(&env.client, "pool", 4).await;
    wait_running(&env.client, 8).await.unwrap();
    assert_scaledown_safe(env, &[&user]);
}

/// 5. Two replicas with leader election: only the leader acts (node and pod writes come from
/// one identity); when it is killed mid-drain the other takes the Lease over and finishes the
/// drains, and the two never act at the same time. (On the real backend each replica's
/// kubeconfig impersonates its own user, so that the audit log tells them apart.)
async fn two_replicas_only_the_leader_acts(backend) {
    // Evicted pods take their grace period of 30 s sim time: 3 s of real time.
    let c = start(backend, 10.0).await;
    let env = &c.env;
    small_cluster(&c, 4, 2, 4, None).await;
    add_keep_nodes(&c).await;
    let replica = |name: &str| match backend {
        Backend::Sim => Controller::spawn(env, name, true, DEFAULT_RECHECK).unwrap(),
        Backend::Real => {
            let kc = impersonating_kubeconfig(env, name).unwrap();
            Controller::spawn_with_kubeconfig(&kc, name, true, DEFAULT_RECHECK).unwrap()
        }
    };
    let mut replicas = BTreeMap::from([("ctl-a", replica("ctl-a")), ("ctl-b", replica("ctl-b"))]);
    apply_policy(
        &env.client,
        "pool",
        json!({"utilizationThreshold": 0.6, "maxDrainParallelism": 2}),
    )
    .await;
    let acts = |r: &AuditRecord| {
        r.user.starts_with("ctl-") && (r.resource == "nodes" || r.resource == "pods")
    };
    let leader = wait_for("a first eviction", Duration::from_secs(30), || async {
        env.audit()
            .ok()?
            .iter()
            .find(|r| accepted_eviction(r))
            .map(|r| r.user.clone())
    })
    .await
    .unwrap();
    assert!(leader.starts_with("ctl-"), "a replica evicted: {leader}");
    let standby = if leader == "ctl-a" { "ctl-b" } else { "ctl-a" };
    replicas.get_mut(leader.as_str()).unwrap().kill().await.unwrap();
    // Requests the leader sent before it died complete (and are logged) a moment later; the
    // standby cannot take the Lease over for seconds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed_at = audit(env).len();
    assert!(
        nodes(&env.client).await.len() > 2,
        "drains were left for the standby"
    );
    wait_nodes_deleted(
        &env.client,
        "pool",
        &names("drain-", 4),
        Duration::from_secs(90),
    )
    .await;

    let audit = audit(env);
    let before: BTreeSet<&str> = audit[..killed_at]
        .iter()
        .filter(|r| acts(r))
        .map(|r| r.user.as_str())
        .collect();
    let after: BTreeSet<&str> = audit[killed_at..]
        .iter()
        .filter(|r| acts(r))
        .map(|r| r.user.as_str())
        .collect();
    assert_eq!(
        before,
        BTreeSet::from([leader.as_str()]),
        "only the leader acted"
    );
    assert_eq!(after, BTreeSet::from([standby]), "then only the new leader");
    let lease_writers: BTreeSet<&str> = audit
        .iter()
        .filter(|r| r.resource == "leases.coordination.k8s.io")
        .map(|r| r.user.as_str())
        .collect();
    assert!(
        lease_writers.contains(leader.as_str()) && lease_writers.contains(standby),
        "both held the Lease in turn: {lease_writers:?}"
    );
    let survivor = replicas.get_mut(standby).unwrap();
    assert!(survivor.alive());
    assert!(survivor.logged("caches synced"));
    wait_removed(&env.client, "pool", 4).await;
    wait_running(&env.client, 8).await.unwrap();
    let left = nodes(&env.client).await;
    assert!(ebb_tainted(&left).is_empty(), "{:?}", ebb_tainted(&left));
    assert_scaledown_safe(env, &["ctl-a", "ctl-b"]);
}

/// 6. DryRun plans and reports, and writes nothing to nodes or pods.
async fn dry_run_writes_nothing_to_nodes_or_pods(backend) {
    let c = start(backend, 20.0).await;
    let env = &c.env;
    small_cluster(&c, 4, 2, 4, None).await;
    add_keep_nodes(&c).await;
    let _ctl = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    apply_policy(
        &env.client,
        "pool",
        json!({"utilizationThreshold": 0.6, "mode": "DryRun"}),
    )
    .await;
    // The planner runs: candidates are reported.
    wait_status(
        &env.client,
        "pool",
        "candidates reported",
        Duration::from_secs(20),
        |s| (s.candidates >= 1 && s.candidate_nodes.len() == s.candidates as usize).then_some(()),
    )
    .await;
    let user = controller_audit_user(env, "pool").await.unwrap();
    // A few more loops (scanInterval 1s) in which nothing changes: no new Event either.
    let events_of = |audit: &[AuditRecord]| {
        audit
            .iter()
            .filter(|r| r.user == user && r.resource.starts_with("events"))
            .count()
    };
    // The first loops report what they found (a pod still arriving on a node can change a
    // reason once); wait for 2 s without an Event, at most 20 s, then measure 4 s more. A
    // controller that writes an Event every loop never settles and fails here.
    let mut events_before = events_of(&audit(env));
    let mut settled = false;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = events_of(&audit(env));
        if now == events_before {
            settled = true;
            break;
        }
        events_before = now;
    }
    assert!(settled, "an Event every 2 s for 20 s: not only on transitions");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let audit = audit(env);
    let event_writes: Vec<String> = audit
        .iter()
        .filter(|r| r.user == user && r.resource.starts_with("events"))
        .map(|r| format!("{} {} {}", r.verb, r.name, r.time))
        .collect();
    assert_eq!(
        events_of(&audit),
        events_before,
        "Events only on transitions: {event_writes:#?}"
    );
    let writes = node_or_pod_writes(&audit, &user);
    assert!(writes.is_empty(), "DryRun wrote {writes:?}");
    let all = nodes(&env.client).await;
    assert_eq!(all.len(), 6);
    assert!(ebb_tainted(&all).is_empty());
    assert_scaledown_safe(env, &[&user]);
}

/// 7. A pod lands on the node between the plan and the re-check after the taint: the node is
/// untainted and not drained.
async fn pod_landing_after_the_taint_cancels_the_drain(backend) {
    let c = start(backend, 20.0).await;
    let env = &c.env;
    small_cluster(&c, 1, 2, 1, None).await;
    add_keep_nodes(&c).await;
    // Three seconds between the taint and the re-check.
    let _ctl = Controller::spawn(env, CONTROLLER, false, "3s").unwrap();
    apply_policy(&env.client, "pool", json!({"utilizationThreshold": 0.6})).await;
    wait_for(
        "drain-0 tainted to-be-deleted",
        Duration::from_secs(20),
        || async {
            nodes(&env.client)
                .await
                .get("drain-0")
                .is_some_and(|n| has_taint(n, TO_BE_DELETED))
                .then_some(())
        },
    )
    .await
    .unwrap();
    bare_pod(&env.client, "latecomer", "drain-0").await.unwrap();
    wait_for("drain-0 untainted", Duration::from_secs(15), || async {
        nodes(&env.client)
            .await
            .get("drain-0")
            .is_some_and(|n| !has_taint(n, TO_BE_DELETED))
            .then_some(())
    })
    .await
    .unwrap();
    let user = controller_audit_user(env, "pool").await.unwrap();
    // Some loops later it is still there, untouched.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = nodes(&env.client).await;
    assert!(all.contains_key("drain-0"), "not deleted");
    assert!(!has_taint(&all["drain-0"], TO_BE_DELETED));
    let audit = audit(env);
    let evictions: Vec<&AuditRecord> = audit.iter().filter(|r| is_eviction(r)).collect();
    assert!(evictions.is_empty(), "nothing evicted: {evictions:?}");
    let on_node = wait_for("3 pods on drain-0", Duration::from_secs(10), || async {
        let n = running_pods(&env.client)
            .await
            .iter()
            .filter(|p| node_of(p) == "drain-0")
            .count();
        (n == 3).then_some(n)
    })
    .await;
    assert!(on_node.is_ok(), "its two pods and the latecomer still run there: {on_node:?}");
    // The give-up is recorded, naming the pod that landed.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(env.client.clone());
    let failed = wait_for("a DrainFailed Event", Duration::from_secs(10), || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("DrainFailed"))
    })
    .await
    .unwrap();
    let note = failed.note.unwrap_or_default();
    assert!(note.contains("default/latecomer"), "{note}");
    assert_scaledown_safe(env, &[&user]);
}

/// 8. The policy is deleted mid-run: its finalizer removes ebb's taints and the drains stop.
async fn deleting_the_policy_mid_run_cleans_up(backend) {
    // Evicted pods take their grace period of 30 s sim time: 6 s of real time.
    let c = start(backend, 5.0).await;
    let env = &c.env;
    small_cluster(&c, 6, 3, 4, None).await;
    add_keep_nodes(&c).await;
    let mut ctl = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    apply_policy(
        &env.client,
        "pool",
        json!({"utilizationThreshold": 0.6, "maxDrainParallelism": 2}),
    )
    .await;
    wait_audit(env, "a first eviction", Duration::from_secs(30), accepted_eviction).await;
    let user = controller_audit_user(env, "pool").await.unwrap();
    let before = nodes(&env.client).await;
    assert!(
        before.values().any(|n| has_taint(n, TO_BE_DELETED)),
        "a drain is in flight"
    );
    Api::<ScaleDownPolicy>::all(env.client.clone())
        .delete("pool", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the policy gone", Duration::from_secs(40), || async {
        policy(&env.client, "pool").await.is_none().then_some(())
    })
    .await
    .unwrap();
    let gone_at = audit(env).len();
    let all = nodes(&env.client).await;
    assert!(
        ebb_tainted(&all).is_empty(),
        "ebb taints left: {:?}",
        ebb_tainted(&all)
    );
    let drain_left = all.keys().filter(|n| n.starts_with("drain-")).count();
    assert!(
        drain_left >= 4,
        "the drains stopped ({drain_left} of 6 nodes left)"
    );
    // Nothing more happens to nodes or pods.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let audit = audit(env);
    let later: Vec<&AuditRecord> = node_or_pod_writes(&audit[gone_at..], &user);
    assert!(later.is_empty(), "writes after the policy went: {later:?}");
    assert!(ctl.alive(), "the controller keeps running");
    // The pods evicted before the deletion run again, elsewhere.
    wait_running(&env.client, 12).await.unwrap();
    assert_scaledown_safe(env, &[&user]);
}

/// 9. Two nodes at the same utilisation, room for only one to go: the node agent of drain-0
/// reports warm data for two roles, so the planner removes drain-1 (by name, drain-0 would go).
async fn the_node_with_warm_data_is_kept_at_equal_utilisation(backend) {
    use ebb_api::nodestate::NodeState;
    use kube::api::{Patch, PatchParams};
    let c = start(backend, 20.0).await;
    let env = &c.env;
    small_cluster(&c, 2, 1, 2, None).await;
    let homes: BTreeSet<String> = running_pods(&env.client)
        .await
        .iter()
        .map(node_of)
        .collect();
    assert_eq!(homes, names("drain-", 2), "one pod per node to start with");

    let states: Api<NodeState> = Api::all(env.client.clone());
    let st: NodeState = serde_json::from_value(json!({
        "apiVersion": "ebb.dev/v1alpha1", "kind": "NodeState",
        "metadata": {"name": "drain-0"}, "spec": {"nodeName": "drain-0"},
    }))
    .unwrap();
    states.create(&PostParams::default(), &st).await.unwrap();
    let localized = |role: &str| {
        json!({"namespace": "data", "placementHistory": "db", "role": role, "name": "blocks",
               "sizeBytes": 1_073_741_824i64, "state": "Localized"})
    };
    states
        .patch_status(
            "drain-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "localized": [localized("primary"), localized("replica")], "localizedCount": 2}})),
        )
        .await
        .unwrap();

    let gone: BTreeSet<String> = ["drain-1".to_string()].into();
    let _ctl = run_pool_policy(env, &gone, Duration::from_secs(40)).await;
    wait_removed(&env.client, "pool", 1).await;
    let user = controller_audit_user(env, "pool").await.unwrap();
    let all = nodes(&env.client).await;
    assert!(all.contains_key("drain-0"), "the warm node stays");
    assert!(!has_taint(&all["drain-0"], TO_BE_DELETED));
    wait_running(&env.client, 2).await.unwrap();
    let homes: BTreeSet<String> = running_pods(&env.client)
        .await
        .iter()
        .map(node_of)
        .collect();
    assert_eq!(homes, ["drain-0".to_string()].into());
    assert_scaledown_safe(env, &[&user]);
}

/// The PodDisruptionBudget check can fail: a Ready pod of a budget that allows no disruption
/// deleted directly (here by the test's own user, standing in for a controller that bypasses
/// the Eviction API) is reported, on both backends.
async fn the_pdb_check_reports_a_pod_deleted_while_its_budget_allows_none(backend) {
    let c = start(backend, 20.0).await;
    let env = &c.env;
    small_cluster(&c, 2, 1, 2, Some(json!({"minAvailable": 2}))).await;
    // The disruption controller has published the budget (no disruption allowed).
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(env.client.clone(), "default");
    wait_for("the budget published", Duration::from_secs(30), || async {
        let s = pdbs.get("app-0").await.ok()?.status?;
        (s.current_healthy == 2 && s.disruptions_allowed == 0).then_some(())
    })
    .await
    .unwrap();
    let victim = running_pods(&env.client).await.remove(0);
    let name = victim.metadata.name.clone().unwrap();
    Api::<Pod>::namespaced(env.client.clone(), "default")
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    // The test's own user as the audit log records it.
    let me = wait_for("the delete in the audit log", Duration::from_secs(10), || async {
        env.audit()
            .ok()?
            .into_iter()
            .find(|r| r.resource == "pods" && r.verb == "delete" && r.name == name)
            .map(|r| r.user)
    })
    .await
    .unwrap();
    let v = pdb_safety::violations(env, &[&me]).unwrap();
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].pod, format!("default/{name}"));
    assert_eq!(v[0].pdb, "default/app-0");
    // Another user's writes are not judged.
    assert!(pdb_safety::violations(env, &["nobody"]).unwrap().is_empty());
}


/// 3b. A pod annotated `cluster-autoscaler.kubernetes.io/safe-to-evict: on-completion` keeps
/// its node (`RunsToCompletion` in status, the node never tainted) while its neighbours go; once
/// it is gone the node goes too. A static pod (`kubernetes.io/config.source: file`) on a
/// neighbour keeps nothing and is never evicted.
async fn a_pod_that_runs_to_completion_keeps_its_node_until_it_is_done(backend) {
    let c = start(backend, 20.0).await;
    let env = &c.env;
    small_cluster(&c, 3, 1, 3, None).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    for (name, node, key, value) in [
        ("batch", "drain-1", "cluster-autoscaler.kubernetes.io/safe-to-evict", "on-completion"),
        ("static", "drain-2", "kubernetes.io/config.source", "file"),
    ] {
        bare_pod(&env.client, name, node).await.unwrap();
        pods.patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .unwrap();
    }
    wait_running(&env.client, 5).await.unwrap();
    add_keep_nodes(&c).await;
    let gone: BTreeSet<String> = ["drain-0", "drain-2"].map(String::from).into();
    let _ctl = run_pool_policy(env, &gone, Duration::from_secs(40)).await;
    let user = controller_audit_user(env, "pool").await.unwrap();
    let blocked = wait_status(
        &env.client,
        "pool",
        "drain-1 reported blocked by its pod",
        Duration::from_secs(10),
        |s| {
            s.unremovable_nodes
                .iter()
                .find(|u| u.node == "drain-1" && u.reason == UnremovableReason::BlockedByPod)
                .cloned()
        },
    )
    .await;
    assert_eq!(blocked.pod.as_deref(), Some("default/batch"));
    assert_eq!(
        blocked.pod_reason,
        Some(ebb_api::reasons::BlockingPodReason::RunsToCompletion)
    );
    let all = nodes(&env.client).await;
    assert!(!has_taint(&all["drain-1"], TO_BE_DELETED));
    let audit = audit(env);
    let evicted: Vec<&AuditRecord> = audit
        .iter()
        .filter(|r| is_eviction(r) && (r.name == "batch" || r.name == "static"))
        .collect();
    assert!(evicted.is_empty(), "neither pod evicted: {evicted:?}");
    // The job is done (here: deleted): the node goes as well.
    pods.delete("batch", &DeleteParams::default()).await.unwrap();
    wait_nodes_deleted(
        &env.client,
        "pool",
        &["drain-1".to_string()].into(),
        Duration::from_secs(60),
    )
    .await;
    assert_scaledown_safe(env, &[&user]);
}

/// 3c. A tenant creates pending pods in its own namespace naming every drain node in ebb's
/// annotations (`ebb.dev/planned-node`, and a made-up `ebb.dev/steering-ticket`), some held by
/// a scheduling gate of its own: ebb counts them on no node, and the pool shrinks as if they
/// were absent (before, each named node stayed `PodsArriving` for as long as the pods did).
async fn tenant_pods_naming_nodes_in_ebb_annotations_keep_none(backend) {
    let c = start(backend, 20.0).await;
    let env = &c.env;
    small_cluster(&c, 3, 1, 3, None).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "tenant"}})).unwrap(),
        )
        .await
        .unwrap();
    let tenant: Api<Pod> = Api::namespaced(env.client.clone(), "tenant");
    for i in 0..6 {
        let gates = if i % 2 == 0 {
            json!([{"name": "tenant.example/hold"}])
        } else {
            json!([])
        };
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("squat-{i}"), "annotations": {
                "ebb.dev/planned-node": format!("drain-{}", i % 3),
                "ebb.dev/steering-ticket": "0123456789abcdef0123456789abcdef"}},
            "spec": {"schedulingGates": gates, "nodeSelector": {"tenant": "nowhere"},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "1"}}}]},
        }))
        .unwrap();
        tenant.create(&PostParams::default(), &pod).await.unwrap();
    }
    add_keep_nodes(&c).await;
    let gone = names("drain-", 3);
    let _ctl = run_pool_policy(env, &gone, Duration::from_secs(60)).await;
    let user = controller_audit_user(env, "pool").await.unwrap();
    let squatters = tenant.list(&ListParams::default()).await.unwrap();
    assert_eq!(squatters.items.len(), 6, "the tenant's pods are left alone");
    let audit = audit(env);
    assert!(
        !audit
            .iter()
            .any(|r| r.user == user
                && r.namespace == "tenant"
                && !matches!(r.verb.as_str(), "get" | "list" | "watch")),
        "ebb wrote to the tenant's namespace"
    );
    assert_scaledown_safe(env, &[&user]);
}

}

// ---- the real control plane only ---------------------------------------------------------

/// kube-apiserver is killed while at least 5 drains are in flight and started again 10 s
/// later: every drain finishes or is rolled back, no ebb taint is left behind, no pod is
/// evicted twice, and the controller never exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_apiserver_restart_mid_drain() {
    // Pods take 15 s to terminate (grace period), so drains are still in flight at the kill.
    let c = start(Backend::Real, 2.0).await;
    let env = &c.env;
    let real = env.real().expect("a real control plane");
    let (pods, _w) = PodLog::watch(&env.client);
    small_cluster(&c, 6, 6, 2, None).await;
    add_keep_nodes(&c).await;
    let mut ctl = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    apply_policy(&env.client, "pool", json!({"utilizationThreshold": 0.6})).await;
    // At least five nodes with an accepted eviction and still there.
    let in_flight = wait_for("5 drains in flight", Duration::from_secs(60), || async {
        let audit = env.audit().ok()?;
        let draining: BTreeSet<String> = audit
            .iter()
            .filter(|r| accepted_eviction(r))
            .filter_map(|r| pods.node(&format!("{}/{}", r.namespace, r.name)))
            .collect();
        let all = nodes(&env.client).await;
        let live: BTreeSet<String> = draining
            .into_iter()
            .filter(|n| all.get(n).is_some_and(|n| has_taint(n, TO_BE_DELETED)))
            .collect();
        (live.len() >= 5).then_some(live)
    })
    .await
    .unwrap();
    let user = controller_audit_user(env, "pool").await.unwrap();
    eprintln!(
        "killing kube-apiserver with {} drains in flight: {in_flight:?}",
        in_flight.len()
    );
    real.restart_apiserver(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        ctl.alive(),
        "the controller outlived the API server's absence"
    );

    // Every drain finishes (its node deleted) or is rolled back (its node untainted): no ebb
    // taint anywhere, and still none 3 s later (no drain started again meanwhile).
    let settled = wait_for(
        "every drain finished or rolled back",
        Duration::from_secs(120),
        || async {
            let quiet =
                |all: &BTreeMap<String, Node>| !all.is_empty() && ebb_tainted(all).is_empty();
            if !quiet(&nodes(&env.client).await) {
                return None;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            let all = nodes(&env.client).await;
            quiet(&all).then_some(all)
        },
    )
    .await;
    let all = match settled {
        Ok(a) => a,
        Err(e) => {
            let all = nodes(&env.client).await;
            panic!(
                "{e}; nodes {:?}; tainted {:?}",
                all.keys().collect::<Vec<_>>(),
                ebb_tainted(&all)
            );
        }
    };
    for n in &in_flight {
        assert!(
            !all.contains_key(n) || !has_taint(&all[n], TO_BE_DELETED),
            "{n} finished or rolled back"
        );
    }
    // The workloads come back once kube-controller-manager's informers have caught up with
    // the restarted API server (reported, not asserted: that is not ebb's doing).
    let back = wait_running(&env.client, 12).await.is_ok();
    eprintln!(
        "after the restart: 12 pods run again within 60 s: {back} ({} run)",
        running_pods(&env.client).await.len()
    );
    if !back {
        let pods: Vec<Pod> = Api::<Pod>::all(env.client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for p in &pods {
            eprintln!(
                "  pod {} on {:?} phase {:?} deleting {} conditions {:?}",
                key(p),
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
                p.status.as_ref().and_then(|s| s.phase.clone()),
                p.metadata.deletion_timestamp.is_some(),
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .map(|cs| cs
                        .iter()
                        .map(|c| format!(
                            "{}={} {:?} {:?}",
                            c.type_, c.status, c.reason, c.last_transition_time
                        ))
                        .collect::<Vec<_>>())
            );
        }
        for (name, n) in nodes(&env.client).await {
            eprintln!(
                "  node {name} conditions {:?} taints {:?}",
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .map(|cs| cs
                        .iter()
                        .map(|c| format!("{}={} {:?}", c.type_, c.status, c.last_transition_time))
                        .collect::<Vec<_>>()),
                n.spec.as_ref().and_then(|s| s.taints.clone())
            );
        }
        let rs: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
            Api::namespaced(env.client.clone(), "default");
        for r in rs
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let s = r.status.unwrap_or_default();
            eprintln!(
                "  replicaset {:?}: replicas {} ready {:?}",
                r.metadata.name, s.replicas, s.ready_replicas
            );
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(ctl.alive(), "the controller never exited");
    let left = nodes(&env.client).await;
    assert!(
        ebb_tainted(&left).is_empty(),
        "no taint left behind: {:?}",
        ebb_tainted(&left)
    );
    let audit = audit(env);
    let twice = evicted_twice(&audit);
    assert!(twice.is_empty(), "no pod evicted twice: {twice:?}");
    eprintln!(
        "after the restart: {} of 6 pool nodes removed, {} evictions accepted",
        6 - left.keys().filter(|n| n.starts_with("drain-")).count(),
        audit.iter().filter(|r| accepted_eviction(r)).count()
    );
    assert_scaledown_safe(env, &[&user]);
    let _ = ctl.kill().await;
}

// ---- a packed pool: the scheduler must follow the plan -----------------------------------

/// A pod with no controller, bound to `node`, requesting `cpu` (fills a node to a set level).
async fn filler(client: &kube::Client, name: &str, node: &str, cpu: &str) {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&Default::default(), &p)
        .await
        .unwrap();
}

/// The remaining nodes have exactly the room the moved pods need, in pieces that fit only one
/// way: three nodes with 3 CPUs free, three with 1 CPU free, and three pods of 3 CPUs and three
/// of 1 CPU to move. The scheduler on its own (LeastAllocated) puts a 1-CPU replacement that
/// comes first on a node with 3 CPUs free, and a 3-CPU replacement then fits nowhere; the plan
/// puts each where it fits, and steering makes the scheduler follow it. Every replacement runs
/// on its planned node, none stays Pending, none is evicted twice, and the controller counts
/// them on plan. On the real control plane only: it is the scheduler's behaviour under test.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_packed_pool_drains_with_every_replacement_on_its_planned_node() {
    let c = start(Backend::Real, 20.0).await;
    let env = &c.env;
    let (pods, _w) = PodLog::watch(&env.client);
    // Six empty drain nodes of 8 CPUs; the six pods spread one per node (1/8 or 3/8 used).
    c.add_nodes(&NodeGroup {
        labels: json!({"pool": "drain"}),
        ..NodeGroup::plain("drain-", 6, "8", "16Gi")
    })
    .await
    .unwrap();
    for (prefix, cpu) in [("small-", "1"), ("big-", "3")] {
        c.add_apps(&Apps {
            prefix,
            replicas: 3,
            requests: json!({"cpu": cpu, "memory": "64Mi"}),
            ..Apps::default()
        })
        .await
        .unwrap();
    }
    wait_running(&env.client, 6).await.unwrap();
    let spread: BTreeSet<String> = running_pods(&env.client)
        .await
        .iter()
        .map(node_of)
        .collect();
    assert_eq!(spread.len(), 6, "one pod per drain node: {spread:?}");
    // The nodes that stay (not selected by the policy): 4 CPUs each, filled to 1 or 3 CPUs.
    c.add_nodes(&keep_nodes(6, "4", "16Gi")).await.unwrap();
    for i in 0..6 {
        let cpu = if i < 3 { "1" } else { "3" };
        filler(
            &env.client,
            &format!("filler-{i}"),
            &format!("keep-{i}"),
            cpu,
        )
        .await;
    }
    wait_running(&env.client, 12).await.unwrap();

    let drain = names("drain-", 6);
    let ctl = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    // The policy at the default utilizationThreshold.
    create_policy(&env.client, "pool", fast_policy_spec("drain"))
        .await
        .unwrap();
    wait_nodes_deleted(&env.client, "pool", &drain, Duration::from_secs(90)).await;
    wait_running(&env.client, 12).await.unwrap();
    let after = running_pods(&env.client).await;
    for p in after
        .iter()
        .filter(|p| !key(p).starts_with("default/filler-"))
    {
        assert!(
            node_of(p).starts_with("keep-"),
            "{} runs on {}",
            key(p),
            node_of(p)
        );
    }
    fidelity(&c, &ctl, &pods, &drain, Duration::from_secs(6)).await;
    let real = env.real().expect("a real control plane");
    let twice = ebb_e2e::audit::evicted_twice_by_uid(&real.evictions().unwrap());
    assert!(twice.is_empty(), "pods evicted more than once: {twice:?}");
    let user = controller_audit_user(env, "pool").await.unwrap();
    assert_scaledown_safe(env, &[&user]);
}

// ---- plans that are final: nothing moves twice ----------------------------------------------

/// A tight pool at `utilizationThreshold: 1` where a greedy first wave and a later correction
/// would move a pod twice: `tp3-0` (3 CPUs) is the lightest node and its pod fits only on
/// `tp0-0` (6 of 10 CPUs, three pods of 3, 2 and 1 CPU); once it has landed there, `tp0-0`
/// (9 of 10) could go too, its pods fitting in the room left on `tp1-0`, `tp2-0` and `tp4-0`
/// (filled to 4, 8 and 8 CPUs by pods that pin them). A plan that only fills `tp0-0` drains
/// `tp3-0` first and `tp0-0` a loop later, evicting `tp3-0`'s replacement again. The plan
/// removes both in one wave, sends `tp3-0`'s pod straight to where it stays, and every
/// replacement runs on its planned node: two nodes removed, no pod created during the run is
/// evicted, nothing Pending. On the real control plane: the scheduler must follow the plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tight_pool_reaches_its_final_count_in_one_wave_moving_nothing_twice() {
    let c = start(Backend::Real, 20.0).await;
    let env = &c.env;
    let (pods, _w) = PodLog::watch(&env.client);
    let tight = |prefix: &'static str| NodeGroup {
        labels: json!({"pool": "tight"}),
        ..NodeGroup::plain(prefix, 1, "10", "16Gi")
    };
    // tp0-0 first, with the pods of 3, 2 and 1 CPU (one Deployment each).
    c.add_nodes(&tight("tp0-")).await.unwrap();
    for (prefix, cpu) in [("a3-", "3"), ("a2-", "2"), ("a1-", "1")] {
        c.add_apps(&Apps {
            prefix,
            requests: json!({"cpu": cpu, "memory": "64Mi"}),
            ..Apps::default()
        })
        .await
        .unwrap();
    }
    wait_running(&env.client, 3).await.unwrap();
    // tp3-0 with the 3-CPU pod (the scheduler prefers the empty node).
    c.add_nodes(&tight("tp3-")).await.unwrap();
    c.add_apps(&Apps {
        prefix: "d3-",
        requests: json!({"cpu": "3", "memory": "64Mi"}),
        ..Apps::default()
    })
    .await
    .unwrap();
    wait_running(&env.client, 4).await.unwrap();
    let on: BTreeMap<String, String> = running_pods(&env.client)
        .await
        .iter()
        .map(|p| (key(p), node_of(p)))
        .collect();
    for (pod, node) in &on {
        let want = if pod.starts_with("default/d3-") {
            "tp3-0"
        } else {
            "tp0-0"
        };
        assert_eq!(node, want, "{pod} starts on {want}: {on:?}");
    }
    // The nodes that stay, filled by pods no scaler may move.
    for (prefix, cpu) in [("tp1-", "4"), ("tp2-", "8"), ("tp4-", "8")] {
        c.add_nodes(&tight(prefix)).await.unwrap();
        filler(
            &env.client,
            &format!("filler-{prefix}0"),
            &format!("{prefix}0"),
            cpu,
        )
        .await;
    }
    wait_running(&env.client, 7).await.unwrap();
    let before: BTreeSet<String> = running_pods(&env.client)
        .await
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();

    let gone: BTreeSet<String> = ["tp0-0", "tp3-0"].map(String::from).into();
    let ctl = Controller::spawn(env, CONTROLLER, false, DEFAULT_RECHECK).unwrap();
    // The policy is named `pool` (as `fidelity` reads it); it selects the nodes labelled tight.
    create_policy(
        &env.client,
        "pool",
        merged(
            fast_policy_spec("tight"),
            &json!({"utilizationThreshold": 1.0}),
        ),
    )
    .await
    .unwrap();
    wait_nodes_deleted(&env.client, "pool", &gone, Duration::from_secs(90)).await;
    wait_running(&env.client, 7).await.unwrap();
    // Long enough for a later loop to take a node that received replacements, had the plan
    // not been final (loops run every second; a node is not removed within 5 s of a binding).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let left: BTreeSet<String> = nodes(&env.client)
        .await
        .into_keys()
        .filter(|n| n.starts_with("tp"))
        .collect();
    assert_eq!(
        left,
        ["tp1-0", "tp2-0", "tp4-0"].map(String::from).into(),
        "the final count, and nothing more"
    );
    let audit = audit(env);
    let again: Vec<String> = audit
        .iter()
        .filter(|r| accepted_eviction(r) && !before.contains(&r.name))
        .map(|r| format!("{}/{}", r.namespace, r.name))
        .collect();
    assert!(again.is_empty(), "replacements evicted again: {again:?}");
    assert_eq!(
        audit.iter().filter(|r| accepted_eviction(r)).count(),
        4,
        "a3, a2, a1 and d3 are each evicted once"
    );
    fidelity(&c, &ctl, &pods, &gone, Duration::from_secs(6)).await;
    let user = controller_audit_user(env, "pool").await.unwrap();
    assert_scaledown_safe(env, &[&user]);
}

/// Registered is not reachable: the configuration points at a URL where nothing answers (as when
/// a NetworkPolicy or routing keeps the API server from the webhook's Service), so the API
/// server fails open and every replacement is created unsteered. The drains go on, and the
/// policy's status says steering is off and why, naming the replacements the webhook was never
/// called for, instead of `Enabled`. On the real control plane: the API server calls the
/// webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_webhook_the_api_server_cannot_reach_is_reported_off() {
    let c = start(Backend::Real, 20.0).await;
    let env = &c.env;
    small_cluster(&c, 3, 2, 3, None).await;
    add_keep_nodes(&c).await;
    let serve = ebb_e2e::harness::free_port().unwrap().to_string();
    let nobody = ebb_e2e::harness::free_port().unwrap();
    let url = format!("https://127.0.0.1:{nobody}/steer");
    let _ctl = Controller::spawn_with(
        env,
        CONTROLLER,
        false,
        DEFAULT_RECHECK,
        &["--steering-port", &serve, "--steering-webhook-url", &url],
    )
    .unwrap();
    apply_policy(&env.client, "pool", json!({"utilizationThreshold": 0.6})).await;
    wait_nodes_deleted(
        &env.client,
        "pool",
        &names("drain-", 3),
        Duration::from_secs(90),
    )
    .await;
    let r = wait_status(
        &env.client,
        "pool",
        "status.replacements.steering names the unreached webhook",
        Duration::from_secs(30),
        |s| {
            let r = s.replacements.as_ref()?;
            r.steering
                .contains("did not call the steering webhook")
                .then(|| r.clone())
        },
    )
    .await;
    assert!(r.steering.starts_with("Disabled"), "{r:?}");
    assert_eq!(r.on_plan, 0, "nothing was steered: {r:?}");
    wait_running(&env.client, 6).await.unwrap();
}
