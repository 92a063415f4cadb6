//! PlacementHistory end to end: the real `ebb-controller run` binary places a gated StatefulSet
//! on ebb-sim and on a real control plane (kwok nodes; the controller with the chart's
//! ServiceAccount); judged from where the pods run, their annotations, the token Secret and the
//! status.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ebb_api::placement::PlacementHistory;
use ebb_e2e::faults::stop_node;
use ebb_e2e::harness::{Backend, ChildProcess, TestEnv, wait_for};
use ebb_e2e::setup::{Cluster, NodeGroup, fetch_metrics, metrics_address};
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

const CONTROLLER: &str = "ebb-controller";
const NS: &str = "default";

/// `backend` with ebb's CRDs and the controller's namespace; ebb-sim runs 5 times faster than
/// real time.
async fn start(backend: Backend) -> Cluster {
    Cluster::start(backend, 5.0).await.unwrap()
}

/// Creates `count` nodes `<prefix>0..` of `cpu` and `memory` with `labels` (ebb-sim's nodes, or
/// kwok nodes) and waits until they are Ready.
async fn nodes(c: &Cluster, prefix: &str, count: usize, cpu: &str, memory: &str, labels: Value) {
    c.add_nodes(&NodeGroup {
        prefix,
        count,
        cpu,
        memory,
        labels,
        taints: json!([]),
    })
    .await
    .unwrap();
}

/// Creates the objects of a YAML stream through the API (both backends).
async fn create(client: &kube::Client, yaml: &str) {
    for doc in yaml.split("\n---\n") {
        let obj: Value = serde_saphyr::from_str(doc).unwrap_or_else(|e| panic!("{e}:\n{doc}"));
        let (group, version, plural) = match obj["kind"].as_str().unwrap_or_default() {
            "PlacementHistory" => ("ebb.dev", "v1alpha1", "placementhistories"),
            "StatefulSet" => ("apps", "v1", "statefulsets"),
            "Pod" => ("", "v1", "pods"),
            other => panic!("create: add the resource of kind {other}"),
        };
        let ar = ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: obj["apiVersion"].as_str().unwrap_or_default().into(),
            kind: obj["kind"].as_str().unwrap_or_default().into(),
            plural: plural.into(),
        };
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or(NS);
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        let o: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
        // A CRD's kind serves a moment after it is established on the real API server.
        wait_for(
            &format!(
                "{} {} created",
                ar.kind,
                o.metadata.name.as_deref().unwrap_or("")
            ),
            Duration::from_secs(20),
            || async { api.create(&PostParams::default(), &o).await.ok() },
        )
        .await
        .unwrap();
    }
}

/// A running `ebb-controller run`; its log is printed when the test fails.
struct Controller {
    child: ChildProcess,
    log: Arc<Mutex<Vec<String>>>,
}

impl Controller {
    fn spawn(env: &TestEnv) -> Self {
        Self::spawn_with(env, &[])
    }

    fn spawn_with(env: &TestEnv, extra: &[&str]) -> Self {
        let mut args = vec![
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--leader-election",
            "false",
            "--namespace",
            "ebb-system",
            "--placement-grace",
            "1s",
            "--placement-status-interval",
            "300ms",
            "--log-filter",
            "info",
        ];
        args.extend_from_slice(extra);
        let mut child = env.spawn_binary_as(CONTROLLER, CONTROLLER, &args).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        child.capture_output_into(&log, "", Some(2000));
        Self { child, log }
    }

    async fn kill(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// The text of its `/metrics` (address from its log line).
    async fn metrics(&self) -> String {
        let addr = wait_for("the metrics address", Duration::from_secs(10), || async {
            metrics_address(&self.log.lock().unwrap())
        })
        .await
        .unwrap();
        fetch_metrics(&addr, None).await.unwrap()
    }
}

/// Who created, deleted and patched which pod, from the audit log: for a failure's message.
fn pod_writes(env: &TestEnv) -> String {
    let Ok(audit) = env.audit() else {
        return "(no audit log)".into();
    };
    let lines: Vec<String> = audit
        .iter()
        .filter(|r| {
            r.resource == "pods" && ["create", "delete", "patch"].contains(&r.verb.as_str())
        })
        .map(|r| {
            format!(
                "{} {} {} {}/{} {} {}",
                r.time, r.user, r.verb, r.name, r.subresource, r.code, r.namespace
            )
        })
        .collect();
    format!("pod writes ({}):\n{}", lines.len(), lines.join("\n"))
}

/// The value of the first metric line starting with `prefix` (0 when absent).
fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

impl Drop for Controller {
    fn drop(&mut self) {
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

/// Three small nodes `home-0..2`, a StatefulSet `db` of 3 gated pods (one per node by required
/// anti-affinity) and its PlacementHistory; then two large nodes `big-0..1` join and the small
/// ones get a soft taint, so a pod the scheduler placed on its own would go to a large node.
async fn statefulset(c: &Cluster) {
    let env = &c.env;
    nodes(c, "home-", 3, "2", "8Gi", json!({})).await;
    // kwok keeps a deleted pod for its whole grace period: 1 s on the real backend. On ebb-sim
    // the default (30 s of sim time) stays: deleted 1 s after it was seen running, db-1 would
    // have run under the history's shortLivedThreshold (1 s) and warmed nothing (no hit).
    let grace = match env.backend() {
        Backend::Real => "\n      terminationGracePeriodSeconds: 1",
        Backend::Sim => "",
    };
    create(
        &env.client,
        &r#"apiVersion: ebb.dev/v1alpha1
kind: PlacementHistory
metadata: {name: db, namespace: default}
spec:
  selector: {matchLabels: {app: db}}
  roleLabel: ebb.dev/role
  shortLivedThreshold: 1s
  roles: [{name: db, escalationTimeout: 3s, nodeFailureThreshold: 1}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: default}
spec:
  replicas: 3
  podManagementPolicy: Parallel
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db, ebb.dev/role: db}}
    spec:GRACE
      schedulingGates: [{name: ebb.dev/placement}]
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {labelSelector: {matchLabels: {app: db}}, topologyKey: kubernetes.io/hostname}
      containers:
      - {name: db, image: db, resources: {requests: {cpu: 500m, memory: 256Mi}}}
"#
        .replace("GRACE", grace),
    )
    .await;
    wait_db_running(&env.client, 3).await;
    nodes(c, "big-", 2, "64", "256Gi", json!({})).await;
    for i in 0..3 {
        taint(
            &env.client,
            &format!("home-{i}"),
            "retiring",
            "PreferNoSchedule",
        )
        .await;
    }
}

async fn taint(client: &kube::Client, node: &str, key: &str, effect: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(node).await.unwrap();
    let mut taints: Vec<serde_json::Value> = n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .map(|t| json!(t))
        .collect();
    taints.push(json!({"key": key, "value": "1", "effect": effect}));
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": taints}})),
        )
        .await
        .unwrap();
}

fn running(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .is_some_and(|s| s.phase.as_deref() == Some("Running"))
}

fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

fn annotation(p: &Pod, key: &str) -> Option<String> {
    p.metadata.annotations.as_ref()?.get(key).cloned()
}

async fn wait_db_running(client: &kube::Client, n: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    wait_for(
        &format!("{n} db pods running"),
        Duration::from_secs(40),
        || async {
            let list = pods.list(&Default::default()).await.ok()?.items;
            let up: Vec<Pod> = list
                .into_iter()
                .filter(|p| p.metadata.name.as_deref().unwrap_or("").starts_with("db-"))
                .filter(running)
                .collect();
            (up.len() == n).then_some(up)
        },
    )
    .await
    .unwrap()
}

/// Deletes `name` (by its UID) and waits for its replacement to run; returns the replacement.
async fn replace(client: &kube::Client, name: &str, force: bool) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let old = pods.get(name).await.unwrap();
    let old_uid = old.metadata.uid.clone();
    let dp = if force {
        DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        }
    } else {
        DeleteParams::default()
    };
    pods.delete(name, &dp).await.unwrap();
    wait_for(
        &format!("a new {name} running"),
        Duration::from_secs(40),
        || async {
            let p = pods.get_opt(name).await.ok()??;
            (p.metadata.uid != old_uid && running(&p)).then_some(p)
        },
    )
    .await
    .unwrap()
}

async fn history(client: &kube::Client) -> PlacementHistory {
    Api::<PlacementHistory>::namespaced(client.clone(), NS)
        .get("db")
        .await
        .unwrap()
}

/// The pod's token was minted with the current key of the controller's Secret, for this pod.
async fn assert_token(client: &kube::Client, pod: &Pod) {
    let token = annotation(pod, "ebb.dev/token").expect("token annotation");
    let secret: Secret = Api::namespaced(client.clone(), "ebb-system")
        .get("ebb-token-keys")
        .await
        .unwrap();
    let data = secret.data.unwrap();
    let id = String::from_utf8(data["current.id"].0.clone()).unwrap();
    let key = &data["current.key"].0;
    assert!(key.len() >= 32);
    let parts: Vec<&str> = token.splitn(6, '.').collect();
    assert_eq!(parts[1], id, "{token}");
    assert_eq!(parts[3], pod.metadata.uid.as_deref().unwrap());
    assert_eq!(parts[5], "db");
    let expires: i64 = parts[2].parse().unwrap();
    assert_eq!(
        ebb_api::token::issue(&id, key, parts[3], "db", expires),
        token,
        "the MAC matches the Secret's key"
    );
}

/// No request of the controller was refused: on the real backend it runs with the chart's
/// ServiceAccount and roles, and a verb missing from them shows as a 403 in the audit log (a
/// missing read shows as a controller that never acts, failing the test's waits).
fn assert_controller_never_forbidden(env: &TestEnv) {
    let user = env.audit_user(CONTROLLER);
    let audit = env.audit().unwrap();
    let forbidden: Vec<_> = audit
        .iter()
        .filter(|r| r.user == user && r.code == 403)
        .collect();
    assert!(
        forbidden.is_empty(),
        "requests of {user} refused (a verb missing from charts/ebb/templates/controller-rbac.yaml?): {forbidden:#?}"
    );
    assert!(
        audit
            .iter()
            .any(|r| r.user == user && (200..300).contains(&r.code)),
        "the audit log shows no write of {user}"
    );
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The kubelet's part on the real backend for pods whose container fails: each incarnation of
/// pod `name` that has been Running for `after` gets a terminated container (exit code 1) and
/// phase Failed, written to its status as the kubelet would.
async fn fail_pods(client: kube::Client, name: &'static str, after: Duration) {
    let pods: Api<Pod> = Api::namespaced(client, NS);
    let mut failed: Option<String> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Ok(Some(p)) = pods.get_opt(name).await else {
            continue;
        };
        let uid = p.metadata.uid.clone();
        if !running(&p) || uid == failed {
            continue;
        }
        let started = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.first())
            .and_then(|c| c.state.as_ref()?.running.as_ref()?.started_at.clone());
        let Some(started) = started else { continue };
        let now = jiff::Timestamp::now();
        if now.duration_since(started.0) < jiff::SignedDuration::try_from(after).unwrap() {
            continue;
        }
        let status = json!({"status": {
            "phase": "Failed",
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodFailed"},
                           {"type": "ContainersReady", "status": "False", "reason": "PodFailed"}],
            "containerStatuses": [{"name": "c", "image": "c", "imageID": "", "ready": false,
                "restartCount": 0, "started": false,
                "state": {"terminated": {"exitCode": 1, "reason": "Error",
                    "startedAt": started.0.to_string(), "finishedAt": now.to_string()}}}]}});
        if pods
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .is_ok()
        {
            failed = uid;
        }
    }
}

ebb_e2e::on_both_backends! {
/// A deleted pod comes back to the node it ran on; so it does after a controller restart.
async fn deleted_pod_returns_home_also_after_a_controller_restart(backend) {
    let c = start(backend).await;
    let env = &c.env;
    let mut ctl = Controller::spawn(env);
    statefulset(&c).await;
    let pods = wait_db_running(&env.client, 3).await;
    let home = |name: &str| {
        node_of(
            pods.iter()
                .find(|p| p.metadata.name.as_deref() == Some(name))
                .unwrap(),
        )
    };
    // First placements: no history yet.
    for p in &pods {
        assert_eq!(
            annotation(p, "ebb.dev/placement").as_deref(),
            Some("Anywhere")
        );
    }

    let back = replace(&env.client, "db-1", false).await;
    assert_eq!(node_of(&back), home("db-1"), "db-1 went back to its node");
    assert_eq!(
        annotation(&back, "ebb.dev/placement").as_deref(),
        Some("Pinned")
    );
    assert_eq!(annotation(&back, "ebb.dev/placed-on"), Some(home("db-1")));
    assert_token(&env.client, &back).await;

    // The history is saved: every home node, and db live on each.
    wait_for(
        "history of 3 nodes saved",
        Duration::from_secs(20),
        || async {
            let s = history(&env.client).await.status?;
            (s.node_count == 3
                && s.roles.first().is_some_and(|r| r.live == 3)
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True"))
            .then_some(())
        },
    )
    .await
    .unwrap();
    let pinned =
        "ebb_placements_total{namespace=\"default\",placement_history=\"db\",outcome=\"pinned\"}";
    // The pod shows its release as soon as the patch is applied; the controller counts it when
    // the patch's answer arrives, a moment later on a loaded machine.
    let mut text = ctl.metrics().await;
    for _ in 0..50 {
        if metric(&text, pinned) >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        text = ctl.metrics().await;
    }
    let anywhere =
        "ebb_placements_total{namespace=\"default\",placement_history=\"db\",outcome=\"anywhere\"}";
    assert_eq!(metric(&text, pinned), 1.0, "{text}");
    assert_eq!(metric(&text, anywhere), 3.0, "{text}");
    // db-1 came back to a node the role had used: a hit.
    assert!(
        metric(
            &text,
            "ebb_placement_hits_total{namespace=\"default\",placement_history=\"db\"}"
        ) >= 1.0,
        "{text}"
    );
    assert!(
        metric(
            &text,
            "ebb_placement_gate_wait_seconds_count{namespace=\"default\",placement_history=\"db\"}"
        ) == 4.0,
        "{text}"
    );
    // A force delete (grace 0) is gone before any pass sees the pod deleting: still no fault of
    // its node, so db-0 comes home each time (threshold 1: two node failures would exclude it).
    for _ in 0..2 {
        let again = replace(&env.client, "db-0", true).await;
        assert_eq!(node_of(&again), home("db-0"), "force-deleted db-0 went back to its node");
        assert_eq!(
            annotation(&again, "ebb.dev/placement").as_deref(),
            Some("Pinned")
        );
    }
    let text = ctl.metrics().await;
    let ends = |class: &str| {
        metric(
            &text,
            &format!("ebb_placement_pod_ends_total{{namespace=\"default\",placement_history=\"db\",class=\"{class}\"}}"),
        )
    };
    for class in ["NodeLost", "StartFailure", "ApplicationFailure"] {
        assert_eq!(ends(class), 0.0, "no end counted against a node as {class}:\n{text}");
    }
    assert!(ends("DeletedByOwner") >= 2.0, "{text}");
    let all: f64 = ["Completed", "DeletedByOwner", "LimitsExceeded", "Preempted"]
        .iter()
        .map(|c| ends(c))
        .sum();
    assert_eq!(
        all,
        3.0,
        "db-1 once, db-0 twice:\n{text}\n{}",
        pod_writes(env)
    );
    ctl.kill().await;
    let _ctl = Controller::spawn(env);
    let back = replace(&env.client, "db-2", false).await;
    assert_eq!(
        node_of(&back),
        home("db-2"),
        "after a restart db-2 went home"
    );
    assert_eq!(
        annotation(&back, "ebb.dev/placement").as_deref(),
        Some("Pinned")
    );
    assert_controller_never_forbidden(env);
}

/// A node a ScaleDownPolicy marks (ebb's taints) gets no pinned pod; a pod whose node is
/// NotReady waits for it until the escalation timeout and then runs elsewhere, relaxed.
async fn drained_and_lost_nodes_are_not_pinned_to(backend) {
    let c = start(backend).await;
    let env = &c.env;
    let _ctl = Controller::spawn(env);
    statefulset(&c).await;
    let pods = wait_db_running(&env.client, 3).await;
    let home = |name: &str| {
        node_of(
            pods.iter()
                .find(|p| p.metadata.name.as_deref() == Some(name))
                .unwrap(),
        )
    };

    // Candidate of a ScaleDownPolicy: never pinned there.
    let drained = home("db-0");
    taint(
        &env.client,
        &drained,
        "ebb.dev/deletion-candidate",
        "PreferNoSchedule",
    )
    .await;
    let moved = replace(&env.client, "db-0", false).await;
    assert_ne!(node_of(&moved), drained);
    assert_ne!(
        annotation(&moved, "ebb.dev/placement").as_deref(),
        Some("Pinned")
    );

    // NotReady: waits, then relaxed after the 3s escalation timeout.
    let lost = home("db-1");
    stop_node(env, &lost).await.unwrap();
    let t0 = std::time::Instant::now();
    let moved = replace(&env.client, "db-1", true).await;
    assert_ne!(node_of(&moved), lost);
    assert_eq!(
        annotation(&moved, "ebb.dev/placement").as_deref(),
        Some("Relaxed")
    );
    assert!(
        t0.elapsed() >= Duration::from_secs(3),
        "released only after the escalation timeout"
    );
    assert_controller_never_forbidden(env);
}

/// A node a real ScaleDownPolicy drains: the pod it evicts is re-created and never pinned back
/// onto it.
async fn pod_evicted_by_a_scaledown_policy_is_not_pinned_back(backend) {
    let c = start(backend).await;
    let env = &c.env;
    let _ctl = Controller::spawn(env);
    statefulset(&c).await;
    let pods = wait_db_running(&env.client, 3).await;
    let db0 = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("db-0"))
        .unwrap();
    let drained = node_of(db0);
    Api::<Node>::all(env.client.clone())
        .patch(
            &drained,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pool": "drain"}}})),
        )
        .await
        .unwrap();
    let policy: ebb_api::ScaleDownPolicy = serde_json::from_value(json!({
        "apiVersion": "ebb.dev/v1alpha1",
        "kind": "ScaleDownPolicy",
        "metadata": {"name": "drain"},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": "drain"}},
            "mode": "Drain",
            "scanInterval": "1s",
            "unneededTime": "0s",
            "utilizationThreshold": 0.6,
            "maxScaleDownParallelism": 10,
            "maxDrainParallelism": 10,
            "evictionRetryInterval": "200ms",
            "maxPodEvictionTime": "60s",
            "recentEvictionWindow": "5s",
        },
    }))
    .unwrap();
    Api::<ebb_api::ScaleDownPolicy>::all(env.client.clone())
        .create(&Default::default(), &policy)
        .await
        .unwrap();
    let api: Api<Pod> = Api::namespaced(env.client.clone(), NS);
    let moved = wait_for(
        "db-0 evicted and running again",
        Duration::from_secs(60),
        || async {
            let p = api.get_opt("db-0").await.ok()??;
            (p.metadata.uid != db0.metadata.uid && running(&p)).then_some(p)
        },
    )
    .await
    .unwrap();
    assert_ne!(node_of(&moved), drained);
    assert_ne!(
        annotation(&moved, "ebb.dev/placed-on"),
        Some(drained.clone())
    );
    // Released at once without a pin: the node is skipped as draining, not waited for as a
    // node the pod does not fit on (that would end `Relaxed` after the escalation timeout).
    assert_eq!(
        annotation(&moved, "ebb.dev/placement").as_deref(),
        Some("Anywhere")
    );
    assert!(annotation(&moved, "ebb.dev/token").is_some());
    assert_controller_never_forbidden(env);
}

/// A pod that keeps failing on its node: pinned back after the first failure, the node excluded
/// after the second (threshold 1), the next pod released off it; once the failure window resets
/// the node is pinned to again.
async fn failing_node_is_excluded_until_the_window_resets(backend) {
    let c = start(backend).await;
    let env = &c.env;
    let _ctl = Controller::spawn(env);
    nodes(&c, "c-", 1, "2", "8Gi", json!({"pool": "crash"})).await;
    // ebb-sim ends the container by its annotations (3 s of sim time, exit 1) and takes a
    // StatefulSet of restartPolicy Never. The real API server allows only Always in a
    // StatefulSet and kwok ends no container, so on the real backend the test stands in for the
    // kubelet: each crash-0 that has run 2 s fails with exit code 1 (see `fail_pods`).
    let restart_policy = match backend {
        Backend::Sim => "Never",
        Backend::Real => "Always",
    };
    create(
        &env.client,
        &format!(
            r#"apiVersion: ebb.dev/v1alpha1
kind: PlacementHistory
metadata: {{name: crash, namespace: default}}
spec:
  selector: {{matchLabels: {{app: crash}}}}
  roleLabel: ebb.dev/role
  shortLivedThreshold: 1s
  failureWindow: 20s
  roles: [{{name: crash, escalationTimeout: 3s, nodeFailureThreshold: 1, nodeSelector: {{pool: crash}}}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: crash, namespace: default}}
spec:
  replicas: 1
  serviceName: crash
  selector: {{matchLabels: {{app: crash}}}}
  template:
    metadata:
      labels: {{app: crash, ebb.dev/role: crash}}
      annotations: {{sim.ebb.dev/exit-after: 3s, sim.ebb.dev/exit-code: "1"}}
    spec:
      restartPolicy: {restart_policy}
      terminationGracePeriodSeconds: 1
      schedulingGates: [{{name: ebb.dev/placement}}]
      containers:
      - {{name: c, image: c, resources: {{requests: {{cpu: 500m}}}}}}
"#
        ),
    )
    .await;
    let _kubelet = (backend == Backend::Real).then(|| {
        AbortOnDrop(tokio::spawn(fail_pods(
            env.client.clone(),
            "crash-0",
            Duration::from_secs(2),
        )))
    });
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), NS);
    let released = |want_pinned: bool| {
        let pods = pods.clone();
        async move {
            let p = pods.get_opt("crash-0").await.ok()??;
            let how = annotation(&p, "ebb.dev/placement")?;
            ((how == "Pinned") == want_pinned).then_some(p)
        }
    };
    // After one failure the node is still pinned to.
    let pinned = wait_for(
        "crash-0 pinned after its first failure",
        Duration::from_secs(30),
        || released(true),
    )
    .await
    .unwrap();
    assert_eq!(
        annotation(&pinned, "ebb.dev/placed-on").as_deref(),
        Some("c-0")
    );
    // After the second the node is excluded: the next pod is kept off it (and stays Pending,
    // as c-0 is the only node of the pool).
    let off = wait_for(
        "crash-0 released off c-0",
        Duration::from_secs(30),
        || async {
            let p = released(false).await?;
            (p.metadata.uid != pinned.metadata.uid).then_some(p)
        },
    )
    .await
    .unwrap();
    let excluded_at = jiff::Timestamp::now();
    let terms = serde_json::to_value(off.spec.as_ref().unwrap().affinity.as_ref().unwrap())
        .unwrap()["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .clone();
    assert_eq!(
        terms[0]["matchFields"][0],
        json!({"key": "metadata.name", "operator": "NotIn", "values": ["c-0"]}),
        "{terms}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), NS);
    wait_for(
        "a NodeExcluded Event about node c-0",
        Duration::from_secs(10),
        || async {
            let list = events.list(&Default::default()).await.ok()?.items;
            list.into_iter()
                .any(|e| {
                    e.reason.as_deref() == Some("NodeExcluded")
                        && e.related.and_then(|r| r.name).as_deref() == Some("c-0")
                })
                .then_some(())
        },
    )
    .await
    .unwrap();

    // The failure window (20s, fixed boundaries) resets: the next pod is pinned to c-0 again.
    let secs = excluded_at.as_second();
    let reset = (secs / 20 + 1) * 20;
    let wait = Duration::from_millis(((reset - secs) * 1000 + 1500) as u64);
    tokio::time::sleep(wait).await;
    pods.delete("crash-0", &DeleteParams::default())
        .await
        .unwrap();
    let again = wait_for(
        "crash-0 pinned after the reset",
        Duration::from_secs(30),
        || async {
            let p = released(true).await?;
            (p.metadata.uid != off.metadata.uid).then_some(p)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        annotation(&again, "ebb.dev/placed-on").as_deref(),
        Some("c-0")
    );
    assert_controller_never_forbidden(env);
}

/// A gated pod no PlacementHistory selects is released unchanged after the grace period.
async fn ungoverned_gated_pod_is_released(backend) {
    let c = start(backend).await;
    let env = &c.env;
    let _ctl = Controller::spawn_with(env, &["--token-rotation", "2s"]);
    nodes(&c, "n-", 1, "2", "8Gi", json!({})).await;
    create(
        &env.client,
        r#"apiVersion: v1
kind: Pod
metadata: {name: lone, namespace: default, labels: {app: lone}}
spec:
  schedulingGates: [{name: ebb.dev/placement}]
  containers: [{name: c, image: c}]
---
apiVersion: ebb.dev/v1alpha1
kind: PlacementHistory
metadata: {name: bad, namespace: default}
spec:
  selector: {matchLabels: {app: bad}}
  roleLabel: role
  failureWindow: 0s
  roles: [{name: r}]
---
apiVersion: v1
kind: Pod
metadata: {name: governed-by-bad, namespace: default, labels: {app: bad, role: r}}
spec:
  schedulingGates: [{name: ebb.dev/placement}]
  containers: [{name: c, image: c}]
"#,
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), NS);
    let p = wait_for(
        "lone released and running",
        Duration::from_secs(30),
        || async {
            let p = pods.get("lone").await.ok()?;
            running(&p).then_some(p)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        annotation(&p, "ebb.dev/placement").as_deref(),
        Some("Ungoverned")
    );
    assert!(
        p.spec.as_ref().unwrap().affinity.is_none(),
        "released unchanged"
    );
    assert!(
        annotation(&p, "ebb.dev/token").is_none(),
        "no token for an ungoverned pod"
    );

    // A pod of an invalid PlacementHistory is released too; the history says why.
    let p = wait_for(
        "governed-by-bad released",
        Duration::from_secs(30),
        || async {
            let p = pods.get("governed-by-bad").await.ok()?;
            running(&p).then_some(p)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        annotation(&p, "ebb.dev/placement").as_deref(),
        Some("Ungoverned")
    );
    let bad = Api::<PlacementHistory>::namespaced(env.client.clone(), NS)
        .get("bad")
        .await
        .unwrap();
    let ready = bad
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(ready.message.contains("failureWindow"), "{}", ready.message);

    // The token key Secret rotates (every 2s here): the old key becomes the previous one.
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), "ebb-system");
    let id = |s: &Secret, k: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|v| String::from_utf8(v.0.clone()).unwrap())
    };
    let first = secrets.get("ebb-token-keys").await.unwrap();
    let first_id = id(&first, "current.id").unwrap();
    let second = wait_for("the token key rotated", Duration::from_secs(20), || async {
        let s = secrets.get("ebb-token-keys").await.ok()?;
        (id(&s, "current.id")? != first_id).then_some(s)
    })
    .await
    .unwrap();
    assert_eq!(id(&second, "previous.id"), Some(first_id));
    assert_eq!(
        second.data.as_ref().unwrap()["previous.key"],
        first.data.as_ref().unwrap()["current.key"]
    );
    assert_controller_never_forbidden(env);
}
}
