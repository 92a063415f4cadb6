//! Stopping and failing over with drains in flight, on a real control plane: SIGTERM (the
//! controller rolls back what it cannot finish, releases its Lease and exits in its bound),
//! SIGKILL of the leader of two replicas (the standby takes over within the Lease's duration),
//! and etcd stopped for 10 s (never two leaders acting). Each ends with no ebb taint left and no
//! pod evicted twice (counted per pod uid from the audit log).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ebb_e2e::audit::evicted_twice_by_uid;
use ebb_e2e::harness::{Backend, TestEnv, wait_for};
use ebb_e2e::setup::{
    Apps, Cluster, Controller, DEFAULT_RECHECK, NodeGroup, controller_audit_user, create_policy,
    fast_policy_spec, has_taint, impersonating_kubeconfig, merged, node_of, nodes,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use serde_json::json;

const TO_BE_DELETED: &str = "ebb.dev/to-be-deleted";
const CANDIDATE: &str = "ebb.dev/deletion-candidate";
/// The Lease the controller campaigns for (`--lease-name` default, `--namespace ebb-system`).
const LEASE: &str = "ebb-controller";
/// The controller's Lease duration (`state::lease::LEASE_DURATION_SECS`).
const LEASE_SECS: u64 = ebb_controller::state::lease::LEASE_DURATION_SECS;

fn ebb_tainted(all: &BTreeMap<String, Node>) -> Vec<String> {
    all.iter()
        .filter(|(_, n)| has_taint(n, TO_BE_DELETED) || has_taint(n, CANDIDATE))
        .map(|(name, _)| name.clone())
        .collect()
}

async fn lease(client: &kube::Client) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), "ebb-system")
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()
}

fn holder(l: &Lease) -> Option<String> {
    l.spec.as_ref()?.holder_identity.clone()
}

/// Two nodes of the retiring pool (`drain-0`, `drain-1`), each with a pod of `flaky-0` that
/// never becomes Ready, two large `keep-` nodes, and a budget (minAvailable 3 over `tier: web`)
/// whose other three pods (`web-0`, on the keep nodes) become Ready `web_ready_after` from now:
/// once the policy runs, both drains start and their evictions wait for the budget until then.
async fn pdb_paced_pool(c: &Cluster, web_ready_after: Duration) {
    c.add_nodes(&NodeGroup::retiring("drain-", 2, "drain"))
        .await
        .unwrap();
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
    let pods: Api<Pod> = Api::all(c.client().clone());
    wait_for(
        "2 flaky pods started, one per drain node",
        Duration::from_secs(30),
        || async {
            let l = pods
                .list(&ListParams::default().fields("status.phase=Running"))
                .await
                .ok()?;
            let on: BTreeSet<String> = l.items.iter().map(node_of).collect();
            (on.len() == 2).then_some(())
        },
    )
    .await
    .unwrap();
    c.create_pdb(json!({"metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 3, "selector": {"matchLabels": {"tier": "web"}}}}))
        .await
        .unwrap();
    c.add_nodes(&NodeGroup {
        prefix: "keep-",
        count: 2,
        cpu: "32",
        memory: "128Gi",
        labels: json!({"pool": "keep"}),
        taints: json!([]),
    })
    .await
    .unwrap();
    c.add_apps(&Apps {
        prefix: "web-",
        replicas: 3,
        labels: json!({"tier": "web"}),
        requests: json!({"cpu": "500m"}),
        ready_after: Some(web_ready_after),
        ..Apps::default()
    })
    .await
    .unwrap();
}

async fn apply_pool_policy(client: &kube::Client) {
    let spec = merged(
        fast_policy_spec("drain"),
        &json!({"utilizationThreshold": 0.6,
            "maxPodEvictionTime": "300s"}),
    );
    create_policy(client, "pool", spec).await.unwrap();
}

/// Waits until both drain nodes are tainted `to-be-deleted` and `ctl` has logged an eviction
/// waiting for its budget: two drains in flight, paced by the budget.
async fn wait_two_paced_drains(env: &TestEnv, ctl: &[&Controller]) {
    wait_for(
        "two drains waiting for the budget",
        Duration::from_secs(60),
        || async {
            let all = nodes(&env.client).await;
            let tainted = ["drain-0", "drain-1"]
                .iter()
                .all(|n| all.get(*n).is_some_and(|n| has_taint(n, TO_BE_DELETED)));
            let waiting = ctl
                .iter()
                .any(|c| c.logged("eviction waits for its disruption budget"));
            (tainted && waiting).then_some(())
        },
    )
    .await
    .unwrap();
}

/// Waits until every drain finished (node gone) or rolled back: no ebb taint for 3 s.
async fn wait_settled(env: &TestEnv, timeout: Duration) -> BTreeMap<String, Node> {
    let settled = wait_for("no ebb taint left", timeout, || async {
        let quiet = |all: &BTreeMap<String, Node>| !all.is_empty() && ebb_tainted(all).is_empty();
        if !quiet(&nodes(&env.client).await) {
            return None;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let all = nodes(&env.client).await;
        quiet(&all).then_some(all)
    })
    .await;
    match settled {
        Ok(all) => all,
        Err(e) => {
            let all = nodes(&env.client).await;
            panic!("{e}; tainted {:?}", ebb_tainted(&all));
        }
    }
}

/// Sends SIGTERM to a process by its id (with `kill`, no libc binding needed).
fn sigterm(pid: u32) {
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -TERM {pid}");
}

fn assert_no_pod_evicted_twice(env: &TestEnv) {
    let real = env.real().expect("a real control plane");
    let evictions = real.evictions().unwrap();
    assert!(
        evictions.iter().all(|e| !e.uid.is_empty()),
        "every eviction names its pod's uid"
    );
    let twice = evicted_twice_by_uid(&evictions);
    assert!(twice.is_empty(), "pods evicted more than once: {twice:?}");
}

/// SIGTERM with two drains in flight, both paced by a PodDisruptionBudget: the controller rolls
/// both back (no taint left), releases its Lease (no holder), exits 0 within its shutdown bound,
/// and logs the counts. Started again, it drains both nodes once the budget allows, evicting no
/// pod twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_with_drains_in_flight_rolls_back_releases_the_lease_and_exits() {
    let c = Cluster::start(Backend::Real, 20.0).await.unwrap();
    let env = &c.env;
    pdb_paced_pool(&c, Duration::from_secs(40)).await;
    let bound = Duration::from_secs(10);
    let mut ctl = Controller::spawn_with(
        env,
        "ebb-controller",
        true,
        DEFAULT_RECHECK,
        &["--shutdown-timeout", "10s"],
    )
    .unwrap();
    apply_pool_policy(&env.client).await;
    wait_two_paced_drains(env, &[&ctl]).await;
    let held = lease(&env.client).await.expect("the Lease exists");
    assert_eq!(holder(&held).as_deref(), Some("ebb-controller"));

    let pid = ctl.child.id().expect("the controller runs");
    let t0 = Instant::now();
    sigterm(pid);
    let status = tokio::time::timeout(bound + Duration::from_secs(5), ctl.child.child.wait())
        .await
        .expect("the controller exits after SIGTERM")
        .unwrap();
    let took = t0.elapsed();
    eprintln!("SIGTERM to exit: {} ms (bound {bound:?})", took.as_millis());
    assert!(status.success(), "exit status 0: {status:?}");
    assert!(took <= bound, "exited within --shutdown-timeout: {took:?}");
    assert!(
        ctl.logged("stopped: drains finished or rolled back"),
        "the stop logs its counts"
    );
    let report = ctl
        .lines()
        .into_iter()
        .find(|l| l.contains("shutdown complete"))
        .expect("a shutdown summary line");
    eprintln!("{report}");
    assert!(report.contains("rolled_back=2"), "{report}");

    let all = nodes(&env.client).await;
    let hard: Vec<&String> = all
        .iter()
        .filter(|(_, n)| has_taint(n, TO_BE_DELETED))
        .map(|(k, _)| k)
        .collect();
    assert!(
        hard.is_empty(),
        "no to-be-deleted taint left behind: {hard:?}"
    );
    eprintln!(
        "after SIGTERM, soft (PreferNoSchedule) candidate taints on {:?}",
        ebb_tainted(&all)
    );
    assert!(
        all.contains_key("drain-0") && all.contains_key("drain-1"),
        "nodes kept"
    );
    assert!(
        all.values().all(|n| n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .is_none_or(|u| !u)),
        "no node left cordoned"
    );
    let released = lease(&env.client).await.expect("the Lease exists");
    assert_eq!(holder(&released), None, "the Lease was released");

    // Started again: the drains run once more and finish; no pod is evicted twice.
    let _again = Controller::spawn(env, "ebb-controller", true, DEFAULT_RECHECK).unwrap();
    wait_for(
        "both drain nodes removed",
        Duration::from_secs(120),
        || async {
            let all = nodes(&env.client).await;
            (!all.contains_key("drain-0") && !all.contains_key("drain-1")).then_some(())
        },
    )
    .await
    .unwrap();
    let left = wait_settled(env, Duration::from_secs(30)).await;
    assert!(ebb_tainted(&left).is_empty());
    assert_no_pod_evicted_twice(env);
    let user = controller_audit_user(env, "pool").await.unwrap();
    ebb_e2e::pdb_safety::assert_safe(env, &[&user]);
}

/// Two replicas with leader election (each impersonating its own user, so the audit log tells
/// them apart).
fn replicas(env: &TestEnv) -> BTreeMap<&'static str, Controller> {
    ["ctl-a", "ctl-b"]
        .into_iter()
        .map(|name| {
            let kc = impersonating_kubeconfig(env, name).unwrap();
            (
                name,
                Controller::spawn_with_kubeconfig(&kc, name, true, DEFAULT_RECHECK).unwrap(),
            )
        })
        .collect()
}

/// Node and pod writes (taints, evictions, deletions) of the replicas, in the audit log's order.
fn acting(env: &TestEnv) -> Vec<(String, String)> {
    env.audit()
        .unwrap()
        .into_iter()
        .filter(|r| r.user.starts_with("ctl-") && (r.resource == "nodes" || r.resource == "pods"))
        .map(|r| (r.user, format!("{} {}/{}", r.verb, r.resource, r.name)))
        .collect()
}

/// Leadership changed hands at most once in the writes, and never back: never two acting.
fn assert_one_leader_at_a_time(writes: &[(String, String)]) {
    let mut order: Vec<&str> = Vec::new();
    for (user, _) in writes {
        if order.last() != Some(&user.as_str()) {
            order.push(user);
        }
    }
    let distinct: BTreeSet<&&str> = order.iter().collect();
    assert_eq!(
        order.len(),
        distinct.len(),
        "the replicas' writes interleave (two leaders acting): {order:?}"
    );
}

/// The leader of two replicas is killed (SIGKILL) with two budget-paced drains in flight: the
/// standby holds the Lease within its duration of the leader's last renewal, resumes the
/// drains, and finishes them once the budget allows; no pod is evicted twice, no taint is
/// left, and the two never act at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_of_the_leader_mid_drain_the_standby_takes_over_within_the_lease() {
    let c = Cluster::start(Backend::Real, 20.0).await.unwrap();
    let env = &c.env;
    pdb_paced_pool(&c, Duration::from_secs(45)).await;
    let mut reps = replicas(env);
    apply_pool_policy(&env.client).await;
    {
        let all: Vec<&Controller> = reps.values().collect();
        wait_two_paced_drains(env, &all).await;
    }
    let before = lease(&env.client).await.expect("the Lease exists");
    let leader = holder(&before).expect("a holder");
    let standby = if leader == "ctl-a" { "ctl-b" } else { "ctl-a" };
    let renewed = before
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0)
        .expect("a renewTime");
    reps.get_mut(leader.as_str()).unwrap().kill().await.unwrap();
    let killed = jiff::Timestamp::now();
    // The last renewal the standby can see (the leader may have renewed after the read above).
    let taken = wait_for(
        "the standby holds the Lease",
        Duration::from_secs(LEASE_SECS * 3),
        || async {
            let l = lease(&env.client).await?;
            (holder(&l).as_deref() == Some(standby)).then_some(l)
        },
    )
    .await
    .unwrap();
    let took_over = jiff::Timestamp::now();
    let acquired = taken
        .spec
        .as_ref()
        .and_then(|s| s.acquire_time.as_ref())
        .map(|t| t.0)
        .unwrap_or(took_over);
    let since_kill = acquired.duration_since(killed).as_secs_f64();
    let since_renewal = acquired.duration_since(renewed).as_secs_f64();
    eprintln!(
        "takeover: the standby acquired the Lease {since_kill:.1} s after the kill, \
         {since_renewal:.1} s after the leader's last renewal seen; Lease duration {LEASE_SECS} s"
    );
    assert!(
        since_kill <= LEASE_SECS as f64 + 2.0,
        "taken over within the Lease's duration of the kill ({since_kill:.1} s)"
    );
    wait_for(
        "both drain nodes removed",
        Duration::from_secs(120),
        || async {
            let all = nodes(&env.client).await;
            (!all.contains_key("drain-0") && !all.contains_key("drain-1")).then_some(())
        },
    )
    .await
    .unwrap();
    let left = wait_settled(env, Duration::from_secs(30)).await;
    assert!(ebb_tainted(&left).is_empty());
    assert!(reps.get_mut(standby).unwrap().alive());
    let writes = acting(env);
    assert_one_leader_at_a_time(&writes);
    assert_no_pod_evicted_twice(env);
    ebb_e2e::pdb_safety::assert_safe(env, &["ctl-a", "ctl-b"]);
}

/// etcd is stopped for 10 s with two budget-paced drains in flight under two replicas: the
/// leader cannot renew its Lease; it either renews once etcd is back or stops acting before the
/// standby may take the Lease over. Either way the two never act at once, every drain finishes
/// or is rolled back (no taint left), and no pod is evicted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_stopped_mid_drain_never_two_leaders() {
    let c = Cluster::start(Backend::Real, 20.0).await.unwrap();
    let env = &c.env;
    let real = env.real().expect("a real control plane");
    pdb_paced_pool(&c, Duration::from_secs(45)).await;
    let mut reps = replicas(env);
    apply_pool_policy(&env.client).await;
    {
        let all: Vec<&Controller> = reps.values().collect();
        wait_two_paced_drains(env, &all).await;
    }
    let before = lease(&env.client).await.expect("the Lease exists");
    let leader = holder(&before).expect("a holder");
    let t0 = Instant::now();
    real.stop_etcd(Duration::from_secs(10)).await.unwrap();
    eprintln!(
        "etcd stopped for 10 s; API server ready again after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // Within a Lease duration after etcd is back, the Lease is held by one replica that acts.
    let after = wait_for(
        "a replica holds the Lease",
        Duration::from_secs(LEASE_SECS * 3),
        || async {
            let l = lease(&env.client).await?;
            holder(&l).filter(|h| h.starts_with("ctl-")).map(|h| (h, l))
        },
    )
    .await
    .unwrap();
    eprintln!(
        "after the outage: {} holds the Lease (held by {leader} before), {} transition(s); \
         Lease duration {LEASE_SECS} s",
        after.0,
        after
            .1
            .spec
            .as_ref()
            .and_then(|s| s.lease_transitions)
            .unwrap_or(0)
    );
    let deposed = reps.get_mut(leader.as_str()).unwrap();
    eprintln!(
        "the leader before the outage {}",
        if deposed.alive() {
            "still runs"
        } else {
            "stopped acting and exited to campaign again"
        }
    );
    let settled = wait_for(
        "both drains done or rolled back",
        Duration::from_secs(150),
        || async {
            let all = nodes(&env.client).await;
            let done = ["drain-0", "drain-1"]
                .iter()
                .all(|n| all.get(*n).is_none_or(|n| !has_taint(n, TO_BE_DELETED)));
            done.then_some(())
        },
    )
    .await;
    if let Err(e) = settled {
        panic!("{e}: {:?}", ebb_tainted(&nodes(&env.client).await));
    }
    let left = wait_settled(env, Duration::from_secs(60)).await;
    assert!(ebb_tainted(&left).is_empty());
    let writes = acting(env);
    assert_one_leader_at_a_time(&writes);
    assert_no_pod_evicted_twice(env);
    ebb_e2e::pdb_safety::assert_safe(env, &["ctl-a", "ctl-b"]);
}
