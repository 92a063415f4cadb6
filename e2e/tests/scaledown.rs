//! The ScaleDownPolicy controller end to end: the real `ebb-controller run` binary against a
//! simulated cluster, judged from the sim's audit log, PDB records, node taints and policy status.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ebb_api::ScaleDownPolicy;
use ebb_api::reasons::UnremovableReason;
use ebb_e2e::harness::{ChildProcess, TestEnv, wait_for};
use ebb_e2e::scenario::Scenario;
use ebb_e2e::{AuditRecord, Sim, SimConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

const TO_BE_DELETED: &str = "ebb.dev/to-be-deleted";
const CANDIDATE: &str = "ebb.dev/deletion-candidate";
const CONTROLLER: &str = "ebb-controller";

// ---- set-up ------------------------------------------------------------------------------

/// A simulator with ebb's CRDs and the controller's namespace, at `time_factor`.
async fn start(time_factor: f64) -> TestEnv {
    let env = TestEnv::start(SimConfig {
        time_factor,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    if let Some(sim) = env.sim() {
        let crds = ebb_api::crdgen::yaml_stream().unwrap();
        Scenario::from_manifests(&crds)
            .unwrap()
            .load(&sim.api)
            .unwrap();
        load(
            sim,
            "objects:\n- {apiVersion: v1, kind: Namespace, metadata: {name: ebb-system}}\n",
        );
    }
    env
}

fn load(sim: &Sim, yaml: &str) {
    Scenario::from_yaml(yaml).unwrap().load(&sim.api).unwrap();
}

/// Pods that are Running and Ready, by `namespace/name`.
async fn running_pods(client: &kube::Client) -> Vec<Pod> {
    let pods: Api<Pod> = Api::all(client.clone());
    pods.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().is_some_and(|s| {
                    s.phase.as_deref() == Some("Running")
                        && s.conditions
                            .iter()
                            .flatten()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                })
        })
        .collect()
}

async fn wait_running(client: &kube::Client, n: usize) {
    wait_for(
        &format!("{n} pods running"),
        Duration::from_secs(30),
        || async { (running_pods(client).await.len() == n).then_some(()) },
    )
    .await
    .unwrap();
}

fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

fn key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Every node a pod (`namespace/name`) was ever seen bound to, kept after the pod is gone.
#[derive(Clone, Default)]
struct PodHomes(Arc<Mutex<HashMap<String, String>>>);

impl PodHomes {
    fn watch(client: &kube::Client) -> (Self, tokio::task::JoinHandle<()>) {
        let homes = Self::default();
        let h = homes.clone();
        let api: Api<Pod> = Api::all(client.clone());
        let task = tokio::spawn(async move {
            let mut s = std::pin::pin!(watcher(api, watcher::Config::default()));
            while let Some(ev) = s.next().await {
                if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev {
                    let node = node_of(&p);
                    if !node.is_empty() {
                        h.0.lock().unwrap().insert(key(&p), node);
                    }
                }
            }
        });
        (homes, task)
    }

    fn node(&self, pod: &str) -> Option<String> {
        self.0.lock().unwrap().get(pod).cloned()
    }
}

/// A running `ebb-controller run`; its log is kept and printed when the test fails.
struct Controller {
    child: ChildProcess,
    log: Arc<Mutex<Vec<String>>>,
}

impl Controller {
    /// Starts the controller as `user` (its identity in the Lease too).
    fn spawn(env: &TestEnv, user: &str, leader_election: bool, recheck: &str) -> Self {
        let args = [
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--leader-election",
            if leader_election { "true" } else { "false" },
            "--namespace",
            "ebb-system",
            "--identity",
            user,
            "--recheck-delay",
            recheck,
            "--log-filter",
            "info",
        ];
        let mut child = env.spawn_binary_as(user, "ebb-controller", &args).unwrap();
        let log = child.capture_output();
        Self { child, log }
    }

    async fn kill(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// Whether a log line contains `text`.
    fn logged(&self, text: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(text))
    }

    /// Still running (has not exited).
    fn alive(&mut self) -> bool {
        matches!(self.child.child.try_wait(), Ok(None))
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        // Printed when the test fails, or always with EBB_E2E_CONTROLLER_LOG set.
        if std::thread::panicking() || std::env::var_os("EBB_E2E_CONTROLLER_LOG").is_some() {
            let log = self.log.lock().unwrap();
            let start = log.len().saturating_sub(150);
            eprintln!(
                "---- controller log (last {} lines) ----",
                log.len() - start
            );
            for l in &log[start..] {
                eprintln!("{l}");
            }
        }
    }
}

/// A ScaleDownPolicy on nodes labelled `pool: drain`, acting fast; `extra` overrides the spec.
async fn apply_policy(client: &kube::Client, name: &str, extra: Value) {
    let mut spec = json!({
        "nodeSelector": {"matchLabels": {"pool": "drain"}},
        "mode": "DrainAndDelete",
        "scanInterval": "1s",
        "unneededTime": "0s",
        "maxScaleDownParallelism": 10,
        "maxDrainParallelism": 10,
        "evictionRetryInterval": "200ms",
        "maxPodEvictionTime": "60s",
        "maxBulkSoftTaintCount": 100,
        "recentEvictionWindow": "5s",
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    let p: ScaleDownPolicy = serde_json::from_value(json!({
        "apiVersion": "ebb.dev/v1alpha1",
        "kind": "ScaleDownPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
    Api::<ScaleDownPolicy>::all(client.clone())
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
}

async fn policy(client: &kube::Client, name: &str) -> Option<ScaleDownPolicy> {
    Api::<ScaleDownPolicy>::all(client.clone())
        .get_opt(name)
        .await
        .unwrap()
}

async fn nodes(client: &kube::Client) -> BTreeMap<String, Node> {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
        .collect()
}

fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

fn names(prefix: &str, count: usize) -> BTreeSet<String> {
    (0..count).map(|i| format!("{prefix}{i}")).collect()
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
            gone.iter().all(|n| !now.contains_key(n)).then_some(())
        },
    )
    .await;
    if let Err(e) = r {
        let status = policy(client, policy_name).await.and_then(|p| p.status);
        let left: Vec<String> = nodes(client)
            .await
            .into_keys()
            .filter(|n| gone.contains(n))
            .collect();
        let all = nodes(client).await;
        for n in &left {
            eprintln!(
                "NODE {n} taints {:?} unsched {:?}",
                all[n].spec.as_ref().and_then(|s| s.taints.clone()),
                all[n].spec.as_ref().and_then(|s| s.unschedulable)
            );
        }
        let pods: Api<Pod> = Api::all(client.clone());
        for p in pods.list(&ListParams::default()).await.unwrap().items {
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

// ---- reading the audit log ---------------------------------------------------------------

fn is_eviction(r: &AuditRecord) -> bool {
    r.resource == "pods" && r.subresource == "eviction" && r.verb == "create"
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
fn drain_intervals(audit: &[AuditRecord], homes: &PodHomes) -> BTreeMap<String, (usize, usize)> {
    let mut first: BTreeMap<String, usize> = BTreeMap::new();
    for (i, r) in audit.iter().enumerate() {
        if is_eviction(r)
            && r.code == 201
            && let Some(node) = homes.node(&format!("{}/{}", r.namespace, r.name))
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

// ---- the tests ---------------------------------------------------------------------------

/// 60 underutilised nodes, maxDrainParallelism 10: every removable node goes, drains overlap
/// (but never more than 10 at once), no PDB is violated, every evicted pod runs elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_underutilised_nodes_drain_in_parallel() {
    let env = start(20.0).await;
    let Some(sim) = env.require_sim("sixty_underutilised_nodes_drain_in_parallel") else {
        return;
    };
    let (homes, _w) = PodHomes::watch(&env.client);
    // 30 apps × 4 pods of 500m (each with a PDB) fill 60 small nodes two pods each; then 4 large
    // nodes, not selected by the policy, join: they can hold every pod. The small pool is being
    // retired (a PreferNoSchedule taint of its own), so replacements go to the large nodes.
    load(
        sim,
        "nodes: {count: 60, namePrefix: drain-, cpu: '2', memory: 8Gi, labels: {pool: drain},\n\
         \x20 taints: [{key: retiring, value: 'true', effect: PreferNoSchedule}]}\n",
    );
    wait_ready(&env.client, "drain-", 60).await;
    load(
        sim,
        "deployments:\n\
         - {count: 30, replicas: 4, requests: {cpu: 500m, memory: 256Mi}, pdb: {maxUnavailable: 1}}\n",
    );
    wait_running(&env.client, 120).await;
    load(
        sim,
        "nodes: {count: 4, namePrefix: keep-, cpu: '64', memory: 256Gi, labels: {pool: keep}}\n",
    );
    wait_ready(&env.client, "keep-", 4).await;
    let before = running_pods(&env.client).await;
    let on_drain = before.len();

    let _ctl = Controller::spawn(&env, CONTROLLER, false, "200ms");
    apply_policy(&env.client, "pool", json!({"utilizationThreshold": 0.6})).await;
    let drain = names("drain-", 60);
    wait_nodes_deleted(&env.client, "pool", &drain, Duration::from_secs(90)).await;

    let audit = sim.audit();
    let intervals = drain_intervals(&audit, &homes);
    let peak = peak_overlap(&intervals);
    assert!(peak >= 2, "drains overlap in time (peak {peak})");
    assert!(
        peak <= 10,
        "at most maxDrainParallelism drains at once (peak {peak})"
    );
    assert!(
        sim.pdb_violations().is_empty(),
        "{:?}",
        sim.pdb_violations()
    );

    // Every evicted pod's app is whole again, on the nodes that stay.
    wait_running(&env.client, 120).await;
    let after = running_pods(&env.client).await;
    let evicted: Vec<&AuditRecord> = audit
        .iter()
        .filter(|r| is_eviction(r) && r.code == 201)
        .collect();
    assert!(evicted.len() >= on_drain, "{} evictions", evicted.len());
    for r in evicted {
        assert_eq!(r.user, CONTROLLER);
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
    wait_removed(&env.client, "pool", 60).await;
}

/// A small cluster for the other tests: `drain` nodes of the retiring pool (selected), filled by
/// `apps` Deployments of `replicas` pods, then two large `keep-` nodes that can take every pod.
/// `deploy_extra` is added to the deployment generator (for example a PDB or pod annotations).
async fn small_cluster(
    env: &TestEnv,
    sim: &Sim,
    drain: usize,
    apps: usize,
    replicas: usize,
    deploy_extra: &str,
) {
    load(
        sim,
        &format!(
            "nodes: {{count: {drain}, namePrefix: drain-, cpu: '2', memory: 8Gi, labels: {{pool: drain}},\n\
             \x20 taints: [{{key: retiring, value: 'true', effect: PreferNoSchedule}}]}}\n"
        ),
    );
    // Every node ready first, so the pods spread evenly.
    wait_ready(&env.client, "drain-", drain).await;
    load(
        sim,
        &format!(
            "deployments:\n\
             - {{count: {apps}, replicas: {replicas}, requests: {{cpu: 500m, memory: 256Mi}}{deploy_extra}}}\n"
        ),
    );
    wait_running(&env.client, apps * replicas).await;
}

async fn add_keep_nodes(env: &TestEnv, sim: &Sim) {
    load(
        sim,
        "nodes: {count: 2, namePrefix: keep-, cpu: '32', memory: 128Gi, labels: {pool: keep}}\n",
    );
    wait_ready(&env.client, "keep-", 2).await;
}

/// Waits until `count` nodes named `prefix…` are Ready (the scheduler places pods only there).
async fn wait_ready(client: &kube::Client, prefix: &str, count: usize) {
    wait_for(
        &format!("{count} {prefix} nodes ready"),
        Duration::from_secs(30),
        || async {
            let ready = nodes(client)
                .await
                .values()
                .filter(|n| {
                    n.metadata
                        .name
                        .as_deref()
                        .is_some_and(|x| x.starts_with(prefix))
                })
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                .count();
            (ready == count).then_some(())
        },
    )
    .await
    .unwrap();
}

/// A pod with no controller, bound to `node` directly (as a kubelet-bound pod is).
async fn bare_pod(client: &kube::Client, name: &str, node: &str) {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m"}}}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
}

fn ebb_tainted(all: &BTreeMap<String, Node>) -> Vec<String> {
    all.iter()
        .filter(|(_, n)| has_taint(n, TO_BE_DELETED) || has_taint(n, CANDIDATE))
        .map(|(name, _)| name.clone())
        .collect()
}

/// 2. A PodDisruptionBudget that allows no disruption yet: the evictions are refused (429) and
/// retried every `evictionRetryInterval` until the budget allows them, the budget is never
/// exceeded, and the drains complete.
///
/// The planner counts budgets itself and never plans more evictions than a budget allows, so a
/// refusal needs pods it may move that the API server still protects: two never-ready pods
/// (evictable only while the budget is met) on the two nodes, and the budget's other pods still
/// starting when the drains begin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pdb_refusals_are_retried_until_the_budget_allows() {
    let env = start(20.0).await;
    let Some(sim) = env.require_sim("pdb_refusals_are_retried_until_the_budget_allows") else {
        return;
    };
    let pods_api: Api<Pod> = Api::all(env.client.clone());
    load(
        sim,
        "nodes: {count: 2, namePrefix: drain-, cpu: '2', memory: 8Gi, labels: {pool: drain},\n\
         \x20 taints: [{key: retiring, value: 'true', effect: PreferNoSchedule}]}\n",
    );
    wait_ready(&env.client, "drain-", 2).await;
    load(
        sim,
        "deployments:\n\
         - {count: 1, namePrefix: flaky-, replicas: 2, labels: {tier: web}, requests: {cpu: 500m},\n\
         \x20 podAnnotations: {sim.ebb.dev/fail-start: 'true'}}\n",
    );
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
    // Three more pods of the budget start on the large nodes; they take 200 s (sim), 10 s of real
    // time, to be ready: the drains begin well before.
    load(
        sim,
        "objects:\n\
         - {apiVersion: policy/v1, kind: PodDisruptionBudget, metadata: {name: web, namespace: default},\n\
         \x20 spec: {minAvailable: 3, selector: {matchLabels: {tier: web}}}}\n\
         nodes: {count: 2, namePrefix: keep-, cpu: '32', memory: 128Gi, labels: {pool: keep}}\n\
         deployments:\n\
         - {count: 1, namePrefix: web-, replicas: 3, labels: {tier: web}, requests: {cpu: 500m},\n\
         \x20 podAnnotations: {sim.ebb.dev/start-delay: 200s}}\n",
    );
    wait_ready(&env.client, "keep-", 2).await;
    let _ctl = Controller::spawn(&env, CONTROLLER, false, "200ms");
    apply_policy(&env.client, "pool", json!({"utilizationThreshold": 0.6})).await;
    wait_nodes_deleted(
        &env.client,
        "pool",
        &names("drain-", 2),
        Duration::from_secs(60),
    )
    .await;

    let audit = sim.audit();
    let evictions: Vec<&AuditRecord> = audit.iter().filter(|r| is_eviction(r)).collect();
    let refused = evictions.iter().filter(|r| r.code == 429).count();
    let accepted: Vec<&&AuditRecord> = evictions.iter().filter(|r| r.code == 201).collect();
    assert!(refused > 0, "the budget refused evictions (429) first");
    assert_eq!(accepted.len(), 2, "each pod evicted once: {accepted:?}");
    assert!(
        evictions
            .iter()
            .all(|r| r.user == CONTROLLER && r.name.starts_with("flaky-0-"))
    );
    // Accepted only once the budget's other three pods were ready.
    let first_accepted = audit
        .iter()
        .position(|r| is_eviction(r) && r.code == 201)
        .unwrap();
    let web_ready = audit[..first_accepted]
        .iter()
        .filter(|r| {
            r.user == "system:kubelet" && r.subresource == "status" && r.name.starts_with("web-0-")
        })
        .map(|r| r.name.as_str())
        .collect::<BTreeSet<_>>();
    assert_eq!(
        web_ready.len(),
        3,
        "the web pods started before an eviction was accepted"
    );
    let last_refused = audit
        .iter()
        .rposition(|r| is_eviction(r) && r.code == 429)
        .unwrap();
    assert!(
        last_refused < first_accepted,
        "no refusal once the budget allowed"
    );
    assert!(
        sim.pdb_violations().is_empty(),
        "{:?}",
        sim.pdb_violations()
    );
    wait_removed(&env.client, "pool", 2).await;
}

/// 2b. A PodDisruptionBudget with maxUnavailable 1 over pods spread one per node: the planner
/// counts the budget, so the nodes are drained one after the other without a refused eviction,
/// the budget is never exceeded, and all of them go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pdb_max_unavailable_one_drains_its_nodes_one_at_a_time() {
    let env = start(20.0).await;
    let Some(sim) = env.require_sim("pdb_max_unavailable_one_drains_its_nodes_one_at_a_time")
    else {
        return;
    };
    small_cluster(&env, sim, 4, 1, 4, ", pdb: {maxUnavailable: 1}").await;
    let spread: BTreeSet<String> = running_pods(&env.client)
        .await
        .iter()
        .map(node_of)
        .collect();
    assert_eq!(spread.len(), 4, "one pod per node");
    add_keep_nodes(&env, sim).await;
    let (homes, _w) = PodHomes::watch(&env.client);
    let _ctl = Controller::spawn(&env, CONTROLLER, false, "200ms");
    apply_policy(&env.client, "pool", json!({"utilizationThreshold": 0.6})).await;
    wait_nodes_deleted(
        &env.client,
        "pool",
        &names("drain-", 4),
        Duration::from_secs(60),
    )
    .await;
    let audit = sim.audit();
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
    assert_eq!(
        peak_overlap(&drain_intervals(&audit, &homes)),
        1,
        "one drain at a time"
    );
    assert!(
        sim.pdb_violations().is_empty(),
        "{:?}",
        sim.pdb_violations()
    );
    wait_removed(&env.client, "pool", 4).await;
}

/// 3. A node whose pod cannot move (no controller) is never tainted to-be-deleted and shows in
/// status with the reason; its neighbours go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmovable_pod_keeps_its_node() {
    let env = start(20.0).await;
    let Some(sim) = env.require_sim("unmovable_pod_keeps_its_node") else {
        return;
    };
    small_cluster(&env, sim, 3, 1, 3, "").await;
    bare_pod(&env.client, "pinned", "drain-1").await;
    wait_running(&env.client, 4).await;
    add_keep_nodes(&env, sim).await;
    let _ctl = Controller::spawn(&env, CONTROLLER, false, "200ms");
    apply_policy(&env.client, "pool", json!({"utilizationThreshold": 0.6})).await;
    let gone: BTreeSet<String> = ["drain-0", "drain-2"].map(String::from).into();
    wait_nodes_deleted(&env.client, "pool", &gone, Duration::from_secs(40)).await;

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
    let audit = sim.audit();
    let writes: Vec<&AuditRecord> = node_or_pod_writes(&audit, CONTROLLER)
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
    let removed: BTreeMap<String, String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
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
        .collect();
    assert_eq!(
        removed.keys().cloned().collect::<BTreeSet<_>>(),
        gone,
        "{removed:?}"
    );
    for (node, note) in &removed {
        assert!(note.contains(&format!("node {node} removed")), "{note}");
    }
}

/// 4. The controller is killed (SIGKILL) mid-drain and started again, and that one is killed
/// right after removing a node: the drains complete, no ebb taint is left, and the removed
/// count is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_drain_then_restart_completes() {
    // Evicted pods take their 30 s (sim) grace period: 3 s of real time.
    let env = start(10.0).await;
    let Some(sim) = env.require_sim("sigkill_mid_drain_then_restart_completes") else {
        return;
    };
    small_cluster(&env, sim, 4, 2, 4, "").await;
    add_keep_nodes(&env, sim).await;
    let mut first = Controller::spawn(&env, CONTROLLER, false, "200ms");
    apply_policy(&env.client, "pool", json!({"utilizationThreshold": 0.6})).await;
    wait_for("a first eviction", Duration::from_secs(30), || async {
        sim.audit()
            .iter()
            .any(|r| is_eviction(r) && r.code == 201)
            .then_some(())
    })
    .await
    .unwrap();
    first.kill().await;
    let all = nodes(&env.client).await;
    let stuck: Vec<&String> = all
        .iter()
        .filter(|(_, n)| has_taint(n, TO_BE_DELETED))
        .map(|(k, _)| k)
        .collect();
    assert!(!stuck.is_empty(), "the kill left drains in flight");
    assert_eq!(all.len(), 6, "no node was removed before the kill");

    // The second one is killed right after it removed a node (before the next status write).
    let mut second = Controller::spawn(&env, CONTROLLER, false, "200ms");
    wait_for("a first node deleted", Duration::from_secs(30), || async {
        sim.audit()
            .iter()
            .any(|r| r.user == CONTROLLER && r.resource == "nodes" && r.verb == "delete")
            .then_some(())
    })
    .await
    .unwrap();
    second.kill().await;
    let _third = Controller::spawn(&env, CONTROLLER, false, "200ms");
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
    wait_running(&env.client, 8).await;
    assert!(sim.pdb_violations().is_empty());
}

/// 5. Two replicas with leader election: only the leader acts (node and pod writes come from
/// one identity); when it is killed mid-drain the other takes the Lease over and finishes the
/// drains, and the two never act at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_only_the_leader_acts() {
    // Evicted pods take their 30 s (sim) grace period: 3 s of real time.
    let env = start(10.0).await;
    let Some(sim) = env.require_sim("two_replicas_only_the_leader_acts") else {
        return;
    };
    small_cluster(&env, sim, 4, 2, 4, "").await;
    add_keep_nodes(&env, sim).await;
    let mut replicas = BTreeMap::from([
        ("ctl-a", Controller::spawn(&env, "ctl-a", true, "200ms")),
        ("ctl-b", Controller::spawn(&env, "ctl-b", true, "200ms")),
    ]);
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
        sim.audit()
            .iter()
            .find(|r| is_eviction(r) && r.code == 201)
            .map(|r| r.user.clone())
    })
    .await
    .unwrap();
    let standby = if leader == "ctl-a" { "ctl-b" } else { "ctl-a" };
    replicas.get_mut(leader.as_str()).unwrap().kill().await;
    let killed_at = sim.audit().len();
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

    let audit = sim.audit();
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
    wait_running(&env.client, 8).await;
    let left = nodes(&env.client).await;
    assert!(ebb_tainted(&left).is_empty(), "{:?}", ebb_tainted(&left));
    assert!(sim.pdb_violations().is_empty());
}

/// 6. DryRun plans and reports, and writes nothing to nodes or pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_writes_nothing_to_nodes_or_pods() {
    let env = start(20.0).await;
    let Some(sim) = env.require_sim("dry_run_writes_nothing_to_nodes_or_pods") else {
        return;
    };
    small_cluster(&env, sim, 4, 2, 4, "").await;
    add_keep_nodes(&env, sim).await;
    let _ctl = Controller::spawn(&env, CONTROLLER, false, "200ms");
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
    // A few more loops (scanInterval 1s) in which nothing changes: no new Event either.
    let events_of = |audit: &[AuditRecord]| {
        audit
            .iter()
            .filter(|r| r.user == CONTROLLER && r.resource.starts_with("events"))
            .count()
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events_before = events_of(&sim.audit());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let audit = sim.audit();
    let event_writes: Vec<String> = audit
        .iter()
        .filter(|r| r.user == CONTROLLER && r.resource.starts_with("events"))
        .map(|r| format!("{} {} {}", r.verb, r.name, r.time))
        .collect();
    assert_eq!(
        events_of(&audit),
        events_before,
        "Events only on transitions: {event_writes:#?}"
    );
    let writes = node_or_pod_writes(&audit, CONTROLLER);
    assert!(writes.is_empty(), "DryRun wrote {writes:?}");
    assert!(
        audit
            .iter()
            .any(|r| r.user == CONTROLLER && r.resource == "scaledownpolicies.ebb.dev"),
        "status is written"
    );
    let all = nodes(&env.client).await;
    assert_eq!(all.len(), 6);
    assert!(ebb_tainted(&all).is_empty());
}

/// 7. A pod lands on the node between the plan and the re-check after the taint: the node is
/// untainted and not drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_landing_after_the_taint_cancels_the_drain() {
    let env = start(20.0).await;
    let Some(sim) = env.require_sim("pod_landing_after_the_taint_cancels_the_drain") else {
        return;
    };
    small_cluster(&env, sim, 1, 2, 1, "").await;
    add_keep_nodes(&env, sim).await;
    // Three seconds between the taint and the re-check.
    let _ctl = Controller::spawn(&env, CONTROLLER, false, "3s");
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
    bare_pod(&env.client, "latecomer", "drain-0").await;
    wait_for("drain-0 untainted", Duration::from_secs(15), || async {
        nodes(&env.client)
            .await
            .get("drain-0")
            .is_some_and(|n| !has_taint(n, TO_BE_DELETED))
            .then_some(())
    })
    .await
    .unwrap();
    // Some loops later it is still there, untouched.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = nodes(&env.client).await;
    assert!(all.contains_key("drain-0"), "not deleted");
    assert!(!has_taint(&all["drain-0"], TO_BE_DELETED));
    let audit = sim.audit();
    let evictions: Vec<&AuditRecord> = audit.iter().filter(|r| is_eviction(r)).collect();
    assert!(evictions.is_empty(), "nothing evicted: {evictions:?}");
    let on_node = running_pods(&env.client)
        .await
        .iter()
        .filter(|p| node_of(p) == "drain-0")
        .count();
    assert_eq!(on_node, 3, "its two pods and the latecomer still run there");
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
}

/// 8. The policy is deleted mid-run: its finalizer removes ebb's taints and the drains stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_policy_mid_run_cleans_up() {
    // Evicted pods take their 30 s (sim) grace period: 6 s of real time.
    let env = start(5.0).await;
    let Some(sim) = env.require_sim("deleting_the_policy_mid_run_cleans_up") else {
        return;
    };
    small_cluster(&env, sim, 6, 3, 4, "").await;
    add_keep_nodes(&env, sim).await;
    let mut ctl = Controller::spawn(&env, CONTROLLER, false, "200ms");
    apply_policy(
        &env.client,
        "pool",
        json!({"utilizationThreshold": 0.6, "maxDrainParallelism": 2}),
    )
    .await;
    wait_for("a first eviction", Duration::from_secs(30), || async {
        sim.audit()
            .iter()
            .any(|r| is_eviction(r) && r.code == 201)
            .then_some(())
    })
    .await
    .unwrap();
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
    let gone_at = sim.audit().len();
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
    let audit = sim.audit();
    let later: Vec<&AuditRecord> = node_or_pod_writes(&audit[gone_at..], CONTROLLER);
    assert!(later.is_empty(), "writes after the policy went: {later:?}");
    assert!(ctl.alive(), "the controller keeps running");
    // The pods evicted before the deletion run again, elsewhere.
    wait_running(&env.client, 12).await;
    assert!(sim.pdb_violations().is_empty());
}

/// 9. Two nodes at the same utilisation, room for only one to go: the node agent of drain-0
/// reports warm data for two roles, so the planner removes drain-1 (by name, drain-0 would go).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_with_warm_data_is_kept_at_equal_utilisation() {
    use ebb_api::nodestate::NodeState;
    use kube::api::{Patch, PatchParams};
    let env = start(20.0).await;
    let Some(sim) = env.require_sim("the_node_with_warm_data_is_kept_at_equal_utilisation") else {
        return;
    };
    small_cluster(&env, sim, 2, 1, 2, "").await;
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

    let _ctl = Controller::spawn(&env, CONTROLLER, false, "200ms");
    apply_policy(&env.client, "pool", json!({"utilizationThreshold": 0.6})).await;
    let gone: BTreeSet<String> = ["drain-1".to_string()].into();
    wait_nodes_deleted(&env.client, "pool", &gone, Duration::from_secs(40)).await;
    wait_removed(&env.client, "pool", 1).await;
    let all = nodes(&env.client).await;
    assert!(all.contains_key("drain-0"), "the warm node stays");
    assert!(!has_taint(&all["drain-0"], TO_BE_DELETED));
    wait_running(&env.client, 2).await;
    let homes: BTreeSet<String> = running_pods(&env.client)
        .await
        .iter()
        .map(node_of)
        .collect();
    assert_eq!(homes, ["drain-0".to_string()].into());
}
