//! The chart installed for real: `helm install` of charts/ebb (the Helm library, helm-sdkpy) on a
//! real control plane with a real node (containerd, kubelet, kube-proxy; `cluster.sh up
//! --real-node`) running the images `images/build.sh` built, pushed to a registry on loopback
//! (`docker-registry`, `skopeo`) and pulled from it by the node's containerd, the chart pointed
//! at it with `image.registry` alone. The controller and the node agent run in pods there: Ready through their probes, in-cluster credentials of the chart's
//! ServiceAccounts (the audit log names the pod and its address), the Lease won, KWOK nodes
//! drained, a gated pod placed and its resource localized, the agent's store surviving its pod,
//! an upgrade to another tag mid-drain, and an uninstall that leaves nothing of ebb running.
//! Needs root, containerd, runc, the CNI plugins, iptables, buildah, musl-gcc, docker-registry
//! and skopeo (`make test`
//! installs them); fails saying what is missing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ebb_api::names::{SCHEDULING_GATE_PLACEMENT, TAINT_DELETION_CANDIDATE, TAINT_TO_BE_DELETED};
use ebb_api::nodestate::RecoveryResult;
use ebb_api::{NodeState, ScaleDownPolicy};
use ebb_e2e::harness::{RealCluster, TestEnv, wait_for};
use ebb_e2e::setup::{
    Apps, Cluster, NodeGroup, create_policy, fast_policy_spec, has_taint, is_running, merged, nodes,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const NS: &str = "ebb-system";
const RELEASE: &str = "ebb";
const APPS_NS: &str = "warm";
/// Real pods start in seconds, but the machine may be busy.
const WAIT: Duration = Duration::from_secs(120);
/// The tag the upgrade moves to: the same images, pushed again under it.
const UPGRADE_TAG: &str = "e2e-upgrade";

/// Fails, saying how to install it, when python3 with helm-sdkpy is missing.
fn require_helm() {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import helm_sdkpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "python3 with helm-sdkpy is not installed; `make test` installs it (pip install --ignore-requires-python helm-sdkpy)"
    );
}

/// One Helm action through `tests/chart/helm_chart.py`; `Ok(result)` or `Err(Helm's message)`.
async fn helm(args: &[&str]) -> Result<Value, String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/chart/helm_chart.py");
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .args(args)
        .env("EBB_HELM_TIMEOUT_SECONDS", WAIT.as_secs().to_string())
        .output()
        .await
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "helm_chart.py {args:?} crashed:\n{stdout}\n{stderr}"
    );
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: not JSON:\n{stdout}\n{stderr}"));
    if report["ok"] == json!(true) {
        Ok(report["result"].clone())
    } else {
        Err(report["error"].as_str().unwrap_or_default().to_string())
    }
}

fn chart_dir() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../charts/ebb")
        .to_string_lossy()
        .into_owned()
}

/// The release's pods, by component (`controller`, `node-agent`).
async fn release_pods(c: &kube::Client, component: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(c.clone(), NS)
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
        )))
        .await
        .unwrap()
        .items
}

fn pod_name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

fn pod_ip(p: &Pod) -> Option<String> {
    p.status.as_ref()?.pod_ip.clone()
}

/// Running on `node`, Ready (its readiness probe passed), its container of image `image`
/// started by the runtime (a containerd ID and an image digest); `None` when not (yet).
fn really_ready(p: &Pod, node: &str, image: &str) -> Option<()> {
    let spec = p.spec.as_ref()?;
    let status = p.status.as_ref()?;
    (spec.node_name.as_deref() == Some(node)).then_some(())?;
    (p.metadata.deletion_timestamp.is_none()).then_some(())?;
    (status.phase.as_deref() == Some("Running")).then_some(())?;
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
        .then_some(())?;
    (spec
        .containers
        .iter()
        .all(|c| c.image.as_deref() == Some(image)))
    .then_some(())?;
    let cs = status.container_statuses.as_ref()?;
    // (the status names the image by one of its tags, any of them once it has two)
    (cs.len() == spec.containers.len()
        && cs.iter().all(|c| {
            c.ready
                && c.started == Some(true)
                && c.container_id
                    .as_deref()
                    .is_some_and(|id| id.starts_with("containerd://"))
                && c.image_id.contains("sha256:")
        }))
    .then_some(())
}

/// Waits until the release runs `replicas` controller pods and one agent pod on `node`, all
/// really ready with images `controller` and `agent`; returns (controllers, agent).
async fn wait_release_ready(
    c: &kube::Client,
    node: &str,
    controller: &str,
    agent: &str,
    replicas: usize,
) -> (Vec<Pod>, Pod) {
    let r = wait_for(
        "the release's pods Running and Ready on the real node",
        WAIT,
        || async {
            let ctrl: Vec<Pod> = release_pods(c, "controller")
                .await
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let agents: Vec<Pod> = release_pods(c, "node-agent")
                .await
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            (ctrl.len() == replicas
                && agents.len() == 1
                && ctrl
                    .iter()
                    .all(|p| really_ready(p, node, controller).is_some())
                && really_ready(&agents[0], node, agent).is_some())
            .then(|| (ctrl, agents[0].clone()))
        },
    )
    .await;
    match r {
        Ok(v) => v,
        Err(e) => {
            let pods = Api::<Pod>::namespaced(c.clone(), NS)
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            panic!(
                "{e}; pods in {NS}:\n{}",
                serde_json::to_string_pretty(
                    &pods
                        .iter()
                        .map(|p| json!({"name": p.metadata.name, "node": p.spec.as_ref().and_then(|s| s.node_name.clone()), "status": p.status}))
                        .collect::<Vec<_>>()
                )
                .unwrap_or_default()
            )
        }
    }
}

/// The raw audit events of the real API server (JSON lines), completed requests only.
fn audit_events(real: &RealCluster) -> Vec<Value> {
    std::fs::read_to_string(real.dir().join("audit.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .collect()
}

/// A write to `resource` by ServiceAccount `account` of the release namespace carrying the
/// token of pod `pod` (the projected token's claims: `authentication.kubernetes.io/pod-name`)
/// from the pod's own address.
fn written_from_pod(events: &[Value], resource: &str, account: &str, pod: &Pod) -> bool {
    let user = format!("system:serviceaccount:{NS}:{account}");
    let (name, ip) = (pod_name(pod), pod_ip(pod).unwrap_or_default());
    events.iter().any(|e| {
        e["objectRef"]["resource"] == resource
            && ["create", "update", "patch"].contains(&e["verb"].as_str().unwrap_or(""))
            && e["user"]["username"] == user.as_str()
            && e["user"]["extra"]["authentication.kubernetes.io/pod-name"] == json!([name])
            && e["sourceIPs"] == json!([ip])
            && e["responseStatus"]["code"]
                .as_i64()
                .is_some_and(|c| c < 300)
    })
}

/// `ebb-node-agent dump` of the agent's store on the host (read-only), by the image's own
/// binary (`agent`): LMDB's lock file holds the writer's pthread mutexes, whose layout musl and
/// glibc do not share, so a glibc build of the dump would wait on the musl agent's lock forever.
async fn dump(agent: &Path, state_dir: &Path) -> Value {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(agent)
            .args(["dump", "--state-dir"])
            .arg(state_dir)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("dump answers within 30 s")
    .unwrap();
    assert!(
        out.status.success(),
        "dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The dumped record of container `name` of pod `uid`.
fn container_record(dump: &Value, uid: &str, name: &str) -> Option<Value> {
    dump["containers"]
        .as_array()?
        .iter()
        .find(|c| c["podUid"] == uid && c["container"] == name)
        .cloned()
}

/// Whether the dump's localization holds a completed resource of digest `sha`.
fn completed_resource(v: &Value, sha: &str) -> bool {
    match v {
        Value::Object(m) => {
            m.get("Completed").is_some_and(|c| c["sha256"] == sha)
                || m.values().any(|x| completed_resource(x, sha))
        }
        Value::Array(a) => a.iter().any(|x| completed_resource(x, sha)),
        _ => false,
    }
}

async fn node_state(c: &kube::Client, node: &str) -> Option<NodeState> {
    Api::<NodeState>::all(c.clone()).get_opt(node).await.ok()?
}

/// Provokes a Degraded policy (a selector matching no node) and a price on a node, starts
/// Prometheus scraping the controller and agent pods as the chart's ServiceMonitors would (job
/// and namespace labels), then evaluates every query of the chart's dashboard and every
/// expression of its PrometheusRule: none is refused, every panel has data, EbbPolicyDegraded
/// fires for that policy and the Down alerts do not.
async fn prometheus_sees_the_dashboard_and_alerts(
    cluster: &Cluster,
    real: &RealCluster,
    controllers: &[Pod],
    agent: &Pod,
    values: &Value,
) {
    use ebb_e2e::prometheus::{Prometheus, ScrapeJob, dashboard_queries};
    let c = cluster.client();
    create_policy(
        c,
        "nothing-matches",
        merged(
            fast_policy_spec("nothing-matches"),
            &json!({"nodeSelector": {"matchLabels": {"pool": "no-such-pool"}}}),
        ),
    )
    .await
    .unwrap();
    let ip = |p: &Pod, port: u16| format!("{}:{port}", pod_ip(p).unwrap_or_default());
    let jobs = [
        ScrapeJob {
            job: format!("{RELEASE}-controller-metrics"),
            namespace: NS.to_string(),
            targets: controllers.iter().map(|p| ip(p, 8080)).collect(),
        },
        ScrapeJob {
            job: format!("{RELEASE}-node-agent-metrics"),
            namespace: NS.to_string(),
            targets: vec![ip(agent, 8081)],
        },
    ];
    let prom = Prometheus::start(&real.dir().join("prometheus"), &jobs)
        .await
        .unwrap_or_else(|e| panic!("Prometheus could not start: {e:#}"));
    let up = wait_for("Prometheus scrapes every target", WAIT, || async {
        let t = prom.targets().await.ok()?;
        (t.len() == controllers.len() + 1 && t.iter().all(|(_, _, h, _)| h == "up")).then_some(())
    })
    .await;
    assert!(
        up.is_ok(),
        "targets: {:?}\n{}",
        prom.targets().await,
        prom.log_text()
    );
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&chart_dir()).join("dashboards/ebb.json")).unwrap(),
    )
    .unwrap();
    // A panel that shows only the non-zero series (`... > 0`: "Throttled nodes by reason") is
    // empty by design while none is; its series must be there all the same.
    let queries: Vec<(String, String)> = dashboard_queries(&dashboard)
        .into_iter()
        .map(|(t, e)| match e.strip_suffix(" > 0") {
            Some(unfiltered) => (t, unfiltered.to_string()),
            None => (t, e),
        })
        .collect();
    assert!(queries.len() >= 20, "{queries:?}");
    // Rates need two samples in their window: wait until every panel has data, or say which
    // have none after the wait.
    let empty = wait_for("every dashboard panel has data", WAIT, || async {
        let mut empty = Vec::new();
        for (title, expr) in &queries {
            match prom.query(expr).await {
                Ok(r) if !r.is_empty() => {}
                Ok(_) => empty.push(format!("{title}: {expr}")),
                Err(e) => panic!("Prometheus refuses panel {title:?}'s query {expr}: {e:#}"),
            }
        }
        empty.is_empty().then_some(())
    })
    .await;
    if empty.is_err() {
        let mut none = Vec::new();
        for (title, expr) in &queries {
            if prom.query(expr).await.map(|r| r.is_empty()).unwrap_or(true) {
                none.push(format!("{title}: {expr}"));
            }
        }
        panic!("dashboard panels with no data:\n{}", none.join("\n"));
    }
    // The alert rules as the chart renders them for this release.
    let mut with_rules = values.clone();
    with_rules["prometheusRule"] = json!({"enabled": true});
    let rendered = ebb_e2e::rbac::render(&with_rules).unwrap();
    let rules: Vec<(String, String)> = rendered
        .iter()
        .filter(|o| o["kind"] == "PrometheusRule")
        .flat_map(|o| o["spec"]["groups"].as_array().cloned().unwrap_or_default())
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            (
                r["alert"].as_str().unwrap_or_default().to_string(),
                r["expr"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert!(rules.len() >= 5, "{rules:?}");
    for (alert, expr) in &rules {
        let result = prom.query(expr).await.unwrap_or_else(|e| {
            panic!("Prometheus refuses alert {alert}'s expression {expr}: {e:#}")
        });
        match alert.as_str() {
            "EbbPolicyDegraded" => {
                // Once the new policy's first loop has been scraped.
                let fired = wait_for("EbbPolicyDegraded fires", WAIT, || async {
                    let r = prom.query(expr).await.ok()?;
                    r.iter()
                        .any(|s| s["metric"]["policy"] == "nothing-matches")
                        .then_some(())
                })
                .await;
                assert!(
                    fired.is_ok(),
                    "EbbPolicyDegraded fires for the policy whose selector matches nothing: {:?}",
                    prom.query(expr).await
                );
            }
            "EbbControllerDown" | "EbbNodeAgentDown" | "EbbNodeAgentStoreUnhealthy" => assert!(
                result.is_empty(),
                "{alert} does not fire while both run healthy: {result:?}"
            ),
            _ => {}
        }
    }
    Api::<ScaleDownPolicy>::all(c.clone())
        .delete("nothing-matches", &DeleteParams::default())
        .await
        .unwrap();
}

/// A built image's reference split for the registry: (`<prefix>/<name>` without the build's
/// registry host, tag); `ghcr.io/ebb-dev/ebb-controller:0.1.0` gives
/// (`ebb-dev/ebb-controller`, `0.1.0`). With a `127.0.0.1:<port>/` reference the host is kept
/// apart the same way.
fn pushed_name(reference: &str) -> (String, String) {
    let (repo, tag) = reference
        .rsplit_once(':')
        .filter(|(_, t)| !t.contains('/'))
        .unwrap_or((reference, "latest"));
    let path = match repo.split_once('/') {
        // The first part is a registry host when it has a dot or a port (as Docker reads it).
        Some((first, rest)) if first.contains('.') || first.contains(':') => rest,
        _ => repo,
    };
    (path.to_string(), tag.to_string())
}

fn image_tag(reference: &str, tag: &str) -> String {
    match reference.rsplit_once(':') {
        Some((repo, _)) => format!("{repo}:{tag}"),
        None => format!("{reference}:{tag}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_chart_runs_ebb_in_pods_on_a_real_node() {
    require_helm();
    let images = ebb_e2e::images::build()
        .await
        .unwrap_or_else(|e| panic!("the images could not be built: {e:#}"));
    let cluster = Cluster {
        env: TestEnv::start_real_with_node(0).await.unwrap_or_else(|e| {
            panic!("the real control plane with a real node could not start: {e:#}")
        }),
        time_factor: 1.0,
    };
    let env = &cluster.env;
    let real = env.real().expect("a real control plane");
    let node = real.real_node().expect("cluster.sh names its real node");
    let node_label = real.env_var("EBB_K8S_REAL_NODE_LABEL").unwrap();
    let pause = real.env_var("EBB_K8S_PAUSE_IMAGE").unwrap();
    // As users install it: the images pushed to a registry (on loopback), the chart pointed at
    // it with `image.registry` alone, the real node's containerd pulling them at install.
    let registry = ebb_e2e::registry::LocalRegistry::start(&real.dir().join("registry"))
        .await
        .unwrap_or_else(|e| panic!("the test registry could not start: {e:#}"));
    registry
        .trust_from(&real.dir().join("containerd/certs.d"))
        .unwrap();
    let built = images.clone();
    let (controller_repo, tag) = pushed_name(&built.controller);
    let image_registry = match controller_repo.rsplit_once('/') {
        Some((prefix, _)) => format!("{}/{prefix}", registry.host),
        None => registry.host.clone(),
    };
    let mut images = built.clone();
    for (archive, reference) in built
        .archives
        .iter()
        .zip([&mut images.controller, &mut images.node_agent])
    {
        let (repo, _) = pushed_name(reference);
        *reference = registry
            .push(archive, &repo, &tag)
            .await
            .unwrap_or_else(|e| panic!("pushing to the test registry: {e:#}"));
    }
    let before = real.ctr(&["images", "ls", "-q"]).await.unwrap();
    assert!(
        !before.contains(&registry.host),
        "containerd has none of the registry's images before the install:\n{before}"
    );
    let c = env.client.clone();
    let kubeconfig = env.kubeconfig.to_string_lossy().into_owned();

    // The agent's host directories under the cluster's own directory; a directory of
    // artifacts the agent may copy from (fileRoots).
    let host = real.dir().join("host");
    let state_dir = host.join("var/lib/ebb");
    // The build's binary for this machine's architecture (the context holds one per platform).
    let arch = match std::env::consts::ARCH {
        "aarch64" => "arm64",
        _ => "amd64",
    };
    let agent_bin = images.dir.join("context").join(arch).join("ebb-node-agent");
    let artifacts = host.join("artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let artifact = b"weights of a model, kept warm on the node\n".repeat(64);
    std::fs::write(artifacts.join("model.bin"), &artifact).unwrap();
    let sha: String = Sha256::digest(&artifact)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let pin = json!({
        "nodeSelector": {node_label.as_str(): "true"},
    });
    let values = json!({
        "image": {"registry": image_registry},
        "controller": merged(pin.clone(), &json!({
            "tolerations": [{"key": node_label, "operator": "Exists", "effect": "NoSchedule"}],
            // Both replicas on the one real node: the default anti-affinity would keep the
            // second Pending.
            "podAntiAffinity": "preferred",
            "recheckDelay": "1s",
            "allowNodeDeletion": true,
            "placementGrace": "2s",
        })),
        "nodeAgent": merged(pin.clone(), &json!({
            "stateDir": state_dir,
            "cacheDir": host.join("var/cache/ebb"),
            "socketDir": host.join("run/ebb"),
            "fileRoots": [artifacts],
            "reportIntervalSeconds": 1,
        })),
    });

    // ---- install: both workloads Running and Ready on the real node, from the local images
    let installed = helm(&[
        "install",
        &kubeconfig,
        NS,
        RELEASE,
        &chart_dir(),
        &values.to_string(),
    ])
    .await
    .unwrap_or_else(|e| panic!("helm install: {e}"));
    assert_eq!(
        installed["info"]["status"],
        json!("deployed"),
        "{installed}"
    );
    let (controllers, agent) =
        wait_release_ready(&c, &node, &images.controller, &images.node_agent, 2).await;
    let listed = real.ctr(&["containers", "ls"]).await.unwrap();
    for image in [&images.controller, &images.node_agent] {
        assert!(
            listed.contains(image.as_str()),
            "containerd runs {image}:\n{listed}"
        );
        let (repo, _) = pushed_name(image);
        let repo = repo.trim_start_matches(&format!("{}/", registry.host));
        assert!(
            registry.manifest_pulls(repo) >= 1,
            "the real node pulled {repo} from the registry; its log:\n{}",
            registry.log_text()
        );
    }

    // ---- the controller: in-cluster credentials of the chart's ServiceAccount, the Lease won
    let leases: Api<Lease> = Api::namespaced(c.clone(), NS);
    let holder = wait_for("a controller pod holds the Lease", WAIT, || async {
        let h = leases
            .get_opt("ebb-controller")
            .await
            .ok()??
            .spec?
            .holder_identity?;
        controllers.iter().any(|p| pod_name(p) == h).then_some(h)
    })
    .await
    .unwrap();
    let leader = controllers.iter().find(|p| pod_name(p) == holder).unwrap();
    assert!(
        written_from_pod(&audit_events(real), "leases", "ebb-controller", leader),
        "the leader {holder} wrote its Lease as system:serviceaccount:{NS}:ebb-controller with its pod's token, from its pod address {:?}",
        pod_ip(leader)
    );

    // ---- the node agent writes its NodeState from its pod, with its node-bound token
    let reported = wait_for("the agent reports its node's NodeState", WAIT, || async {
        node_state(&c, &node).await?.status?.reported_at.map(|_| ())
    })
    .await;
    assert!(reported.is_ok(), "{reported:?}");
    let events = audit_events(real);
    assert!(
        written_from_pod(&events, "nodestates", "ebb-node-agent", &agent),
        "the agent wrote NodeState {node} with its pod's token from {:?}",
        pod_ip(&agent)
    );
    assert!(
        events
            .iter()
            .any(|e| e["objectRef"]["resource"] == "nodestates"
                && e["user"]["extra"]["authentication.kubernetes.io/node-name"] == json!([node])),
        "the agent's token is bound to its node"
    );

    // ---- a ScaleDownPolicy: the controller in its pod drains and deletes two KWOK nodes
    cluster
        .add_nodes(&NodeGroup::retiring("drain-", 2, "drain"))
        .await
        .unwrap();
    cluster
        .add_apps(&Apps {
            count: 2,
            replicas: 1,
            ..Apps::default()
        })
        .await
        .unwrap();
    wait_apps_running(&c, 2).await;
    let keep = NodeGroup {
        labels: json!({"pool": "keep"}),
        ..NodeGroup::plain("keep-", 1, "32", "128Gi")
    };
    cluster.add_nodes(&keep).await.unwrap();
    create_policy(&c, "drain", fast_policy_spec("drain"))
        .await
        .unwrap();
    wait_gone(&c, &["drain-0", "drain-1"]).await;
    let evicted_by_leader = audit_events(real).iter().any(|e| {
        e["objectRef"]["subresource"] == "eviction"
            && e["user"]["username"] == format!("system:serviceaccount:{NS}:ebb-controller")
            && e["sourceIPs"] == json!([pod_ip(leader).unwrap_or_default()])
    });
    assert!(
        evicted_by_leader,
        "the leader's pod evicted the drained nodes' pods"
    );
    wait_apps_running(&c, 2).await;
    // Steering through the chart's Service: the API server called the leader's webhook for
    // both replacements, which landed on the node the plan gave them.
    let steered = wait_for("both replacements steered and on plan", WAIT, || async {
        let r = Api::<ScaleDownPolicy>::all(c.clone())
            .get("drain")
            .await
            .ok()?
            .status?
            .replacements?;
        (r.steering == "Enabled" && r.steered >= 2 && r.on_plan >= 2).then_some(r)
    })
    .await;
    assert!(
        steered.is_ok(),
        "replacements steered through the Service: {:?}",
        Api::<ScaleDownPolicy>::all(c.clone())
            .get("drain")
            .await
            .ok()
            .and_then(|p| p.status)
            .and_then(|s| s.replacements)
    );

    // ---- placement: a gated pod of a PlacementHistory is released by the controller, runs on
    // the real node, and the agent localizes its role's resource
    let ph_pod = place_warm_pod(&c, &node_label, &pause, &artifacts, &sha).await;
    let ph_uid = ph_pod.metadata.uid.clone().unwrap();
    let localized = wait_for("the agent localizes the role's resource", WAIT, || async {
        let st = node_state(&c, &node).await?.status?;
        st.localized
            .iter()
            .any(|l| l.namespace == APPS_NS && l.name == "model" && l.state == "Localized")
            .then_some(())
    })
    .await;
    assert!(
        localized.is_ok(),
        "{localized:?}; NodeState: {}",
        serde_json::to_string_pretty(&node_state(&c, &node).await).unwrap_or_default()
    );
    let before = wait_for("the store records the warm pod launched", WAIT, || async {
        let d = dump(&agent_bin, &state_dir).await;
        container_record(&d, &ph_uid, "main")
            .is_some_and(|r| r["launchedAt"].is_number())
            .then_some(d)
    })
    .await
    .unwrap();
    assert!(
        completed_resource(&before["localization"], &sha),
        "{before}"
    );

    // ---- a real Prometheus scrapes both workloads' pods: every dashboard panel has data, and
    // the alert this run provokes (a Degraded policy) fires
    prometheus_sees_the_dashboard_and_alerts(&cluster, real, &controllers, &agent, &values).await;

    // ---- the agent's pod is deleted; its DaemonSet starts another, which recovers the store
    let old_uid = agent.metadata.uid.clone().unwrap();
    Api::<Pod>::namespaced(c.clone(), NS)
        .delete(&pod_name(&agent), &DeleteParams::default())
        .await
        .unwrap();
    let new_agent = wait_for("a new agent pod Ready", WAIT, || async {
        release_pods(&c, "node-agent").await.into_iter().find(|p| {
            p.metadata.uid.as_deref() != Some(old_uid.as_str())
                && really_ready(p, &node, &images.node_agent).is_some()
        })
    })
    .await
    .unwrap();
    let recovered = wait_for(
        "the new agent reports its store Recovered",
        WAIT,
        || async {
            let st = node_state(&c, &node).await?.status?;
            let r = st.recovery?;
            let after_start =
                r.finished_at.as_ref()?.0 >= new_agent.status.as_ref()?.start_time.as_ref()?.0;
            (r.result == RecoveryResult::Recovered && after_start).then_some(r)
        },
    )
    .await
    .unwrap();
    assert!(recovered.containers >= 1, "{recovered:?}");
    assert!(recovered.localized >= 1, "{recovered:?}");
    let after = dump(&agent_bin, &state_dir).await;
    assert_eq!(
        container_record(&after, &ph_uid, "main").map(|r| r["launchedAt"].clone()),
        container_record(&before, &ph_uid, "main").map(|r| r["launchedAt"].clone()),
        "the warm pod's container, recorded before, is still in the store"
    );
    assert!(completed_resource(&after["localization"], &sha), "{after}");

    // ---- upgrade to another tag of the same images, while a drain runs
    for (archive, image) in built
        .archives
        .iter()
        .zip([&built.controller, &built.node_agent])
    {
        let (repo, _) = pushed_name(image);
        registry.push(archive, &repo, UPGRADE_TAG).await.unwrap();
    }
    start_slow_drain(&cluster).await;
    let mut upgrade_values = values.clone();
    upgrade_values["image"]["tag"] = json!(UPGRADE_TAG);
    let upgraded = helm(&[
        "upgrade",
        &kubeconfig,
        NS,
        RELEASE,
        &chart_dir(),
        &upgrade_values.to_string(),
    ])
    .await
    .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    assert_eq!(upgraded["info"]["status"], json!("deployed"), "{upgraded}");
    let (new_controllers, _) = wait_release_ready(
        &c,
        &node,
        &image_tag(&images.controller, UPGRADE_TAG),
        &image_tag(&images.node_agent, UPGRADE_TAG),
        2,
    )
    .await;
    // The drain the old leader started is finished by the new one: its nodes are gone, and no
    // node is left tainted by a controller that no longer runs.
    wait_gone(&c, &["slow-0", "slow-1", "slow-2"]).await;
    let tainted: Vec<String> = nodes(&c)
        .await
        .into_iter()
        .filter(|(_, n)| has_taint(n, TAINT_TO_BE_DELETED))
        .map(|(name, _)| name)
        .collect();
    assert!(
        tainted.is_empty(),
        "nodes left tainted {TAINT_TO_BE_DELETED}: {tainted:?}"
    );
    let new_holder = wait_for(
        "a controller of the new tag holds the Lease",
        WAIT,
        || async {
            let h = leases
                .get_opt("ebb-controller")
                .await
                .ok()??
                .spec?
                .holder_identity?;
            new_controllers
                .iter()
                .any(|p| pod_name(p) == h)
                .then_some(h)
        },
    )
    .await
    .unwrap();
    assert_ne!(new_holder, holder);

    // ---- uninstall as documented: policies first (their finalizer untaints), then Helm
    let policies: Api<ScaleDownPolicy> = Api::all(c.clone());
    for p in policies.list(&ListParams::default()).await.unwrap() {
        policies
            .delete(
                &p.metadata.name.unwrap_or_default(),
                &DeleteParams::default(),
            )
            .await
            .unwrap();
    }
    wait_for("the policies deleted", WAIT, || async {
        policies
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await
    .unwrap();
    helm(&["uninstall", &kubeconfig, NS, RELEASE])
        .await
        .unwrap_or_else(|e| panic!("helm uninstall: {e}"));
    assert_nothing_left(&cluster, real, &images).await;
}

/// Waits until none of `names` is a Node any more.
async fn wait_gone(c: &kube::Client, names: &[&str]) {
    let r = wait_for(
        &format!("nodes {names:?} drained and deleted"),
        WAIT,
        || async {
            let all = nodes(c).await;
            names.iter().all(|n| !all.contains_key(*n)).then_some(())
        },
    )
    .await;
    if let Err(e) = r {
        let policies = Api::<ScaleDownPolicy>::all(c.clone())
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .map(|p| json!({"name": p.metadata.name, "status": p.status}))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        panic!(
            "{e}; policies: {}",
            serde_json::to_string_pretty(&policies).unwrap_or_default()
        );
    }
}

/// A PlacementHistory `warm` (role `worker`, policy Anywhere, resource `model` from the
/// artifacts directory) and one gated pod of it for the real node, running the pause image;
/// waits until the controller released it and it runs there. Returns the pod.
async fn place_warm_pod(
    c: &kube::Client,
    node_label: &str,
    pause: &str,
    artifacts: &Path,
    sha: &str,
) -> Pod {
    Api::<Namespace>::all(c.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": APPS_NS}})).unwrap(),
        )
        .await
        .unwrap();
    let url = format!("file://{}", artifacts.join("model.bin").display());
    let ph: ebb_api::PlacementHistory = serde_json::from_value(json!({
        "apiVersion": "ebb.dev/v1alpha1", "kind": "PlacementHistory",
        "metadata": {"name": "warm", "namespace": APPS_NS},
        "spec": {"selector": {"matchLabels": {"app": "warm"}}, "roleLabel": "role",
                 "roles": [{"name": "worker", "policy": "Anywhere",
                            "localResources": [{"name": "model", "url": url, "sha256": sha}]}]},
    }))
    .unwrap();
    Api::<ebb_api::PlacementHistory>::namespaced(c.clone(), APPS_NS)
        .create(&PostParams::default(), &ph)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "warm-0", "namespace": APPS_NS, "labels": {"app": "warm", "role": "worker"}},
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE_PLACEMENT}],
            "nodeSelector": {node_label: "true"},
            "tolerations": [{"key": node_label, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": pause, "imagePullPolicy": "Never"}],
        },
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(c.clone(), APPS_NS);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_for(
        "the gated pod released and running on the real node",
        WAIT,
        || async {
            let p = pods.get("warm-0").await.ok()?;
            let gated = p
                .spec
                .as_ref()?
                .scheduling_gates
                .as_ref()
                .is_some_and(|g| !g.is_empty());
            let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
            (!gated && running).then_some(p)
        },
    )
    .await
    .unwrap()
}

/// Three more nodes of the drain pool, each with two pods whose replacements take 2 s to be
/// ready under a PodDisruptionBudget of one: a drain of some seconds. Returns once the
/// controller has tainted the first of them.
async fn start_slow_drain(cluster: &Cluster) {
    let c = cluster.client();
    cluster
        .add_nodes(&NodeGroup::retiring("slow-", 3, "slow"))
        .await
        .unwrap();
    // The keep node, cordoned meanwhile, would take every pod (the slow nodes are tainted
    // PreferNoSchedule).
    set_unschedulable(c, "keep-0", true).await;
    cluster
        .add_apps(&Apps {
            prefix: "slow-app-",
            count: 1,
            replicas: 6,
            pdb: Some(json!({"maxUnavailable": 1})),
            ready_after: Some(Duration::from_secs(2)),
            ..Apps::default()
        })
        .await
        .unwrap();
    wait_apps_running(c, 8).await;
    set_unschedulable(c, "keep-0", false).await;
    create_policy(
        c,
        "slow",
        merged(
            fast_policy_spec("slow"),
            // Two 500m pods on 2 CPUs: half used, under 0.6.
            &json!({"maxDrainParallelism": 3, "utilizationThreshold": 0.6}),
        ),
    )
    .await
    .unwrap();
    wait_for("the slow pool's drain started", WAIT, || async {
        nodes(c)
            .await
            .iter()
            .any(|(name, n)| name.starts_with("slow-") && has_taint(n, TAINT_TO_BE_DELETED))
            .then_some(())
    })
    .await
    .unwrap();
}

/// Waits until exactly `n` pods of namespace `default` (the test's Deployments) run.
async fn wait_apps_running(c: &kube::Client, n: usize) {
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    wait_for(&format!("{n} pods running in default"), WAIT, || async {
        let l = pods.list(&ListParams::default()).await.ok()?;
        (l.items.iter().filter(|p| is_running(p)).count() == n).then_some(())
    })
    .await
    .unwrap();
}

async fn set_unschedulable(c: &kube::Client, node: &str, on: bool) {
    Api::<k8s_openapi::api::core::v1::Node>::all(c.clone())
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"unschedulable": on}})),
        )
        .await
        .unwrap();
}

/// After `helm uninstall`: none of the release's objects, no ebb pod or container on the real
/// node, no ebb taint on any node, no pod held by ebb's scheduling gate.
async fn assert_nothing_left(
    cluster: &Cluster,
    real: &RealCluster,
    images: &ebb_e2e::images::Images,
) {
    let c = cluster.client();
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    let lp = ListParams::default().labels(&selector);
    assert_eq!(
        count::<Deployment>(c, &lp).await,
        0,
        "the release's Deployments gone"
    );
    assert_eq!(
        count::<DaemonSet>(c, &lp).await,
        0,
        "the release's DaemonSets gone"
    );
    assert_eq!(
        count::<ServiceAccount>(c, &lp).await,
        0,
        "the release's ServiceAccounts gone"
    );
    wait_for("the release's pods gone", WAIT, || async {
        Api::<Pod>::namespaced(c.clone(), NS)
            .list(&lp)
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await
    .unwrap();
    let running = wait_for("ebb's containers gone from containerd", WAIT, || async {
        let listed = real.ctr(&["containers", "ls"]).await.ok()?;
        let ebb: Vec<&str> = listed
            .lines()
            .filter(|l| {
                [&images.controller, &images.node_agent]
                    .iter()
                    .any(|i| l.contains(i.as_str()) || l.contains(&image_tag(i, UPGRADE_TAG)))
            })
            .collect();
        ebb.is_empty().then_some(())
    })
    .await;
    assert!(running.is_ok(), "{running:?}");
    let tainted: BTreeMap<String, Vec<String>> = nodes(c)
        .await
        .into_iter()
        .filter_map(|(name, n)| {
            let keys: Vec<String> = n
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .into_iter()
                .map(|t| t.key)
                .filter(|k| k == TAINT_TO_BE_DELETED || k == TAINT_DELETION_CANDIDATE)
                .collect();
            (!keys.is_empty()).then_some((name, keys))
        })
        .collect();
    assert!(tainted.is_empty(), "ebb's taints left: {tainted:?}");
    let gated: BTreeSet<String> = Api::<Pod>::all(c.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| g.iter().any(|g| g.name == SCHEDULING_GATE_PLACEMENT))
        })
        .map(|p| pod_name(&p))
        .collect();
    assert!(
        gated.is_empty(),
        "pods still gated by {SCHEDULING_GATE_PLACEMENT}: {gated:?}"
    );
    // What stays in the namespace: what the controller made at run time, not Helm (no release
    // Secret either): the token Secret (kept on purpose) and the leader-election Lease. The
    // steering CA Secret is owned by the webhook configuration: the garbage collector deletes it.
    let secrets = wait_for("only the token Secret left", WAIT, || async {
        let names: BTreeSet<String> =
            Api::<k8s_openapi::api::core::v1::Secret>::namespaced(c.clone(), NS)
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .filter_map(|s| s.metadata.name)
                .collect();
        (names == BTreeSet::from(["ebb-token-keys".to_string()])).then_some(names)
    })
    .await;
    assert!(
        secrets.is_ok(),
        "Secrets left after uninstall other than ebb-token-keys: {:?}",
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(c.clone(), NS)
            .list(&ListParams::default())
            .await
            .map(|l| l
                .items
                .into_iter()
                .filter_map(|s| s.metadata.name)
                .collect::<Vec<_>>())
    );
    let leases: BTreeSet<String> = Api::<Lease>::namespaced(c.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|l| l.metadata.name)
        .collect();
    assert_eq!(leases, BTreeSet::from(["ebb-controller".to_string()]));
}

/// How many objects of kind `K` in the release's namespace `lp` selects.
async fn count<K>(c: &kube::Client, lp: &ListParams) -> usize
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(c.clone(), NS)
        .list(lp)
        .await
        .unwrap()
        .items
        .len()
}
