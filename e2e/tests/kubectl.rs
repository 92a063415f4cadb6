//! The kubectl built with the control plane (v1.36.3, protobuf bodies by default) against
//! ebb-sim and, where the same assertions hold, the real control plane: everyday operations
//! (create, apply with validation, explain, scale, rollout, drain...) judged on cluster state.
//! A missing kubectl fails the tests, naming how to build it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use ebb_e2e::SimConfig;
use ebb_e2e::harness::{Backend, TestEnv, wait_for};
use ebb_e2e::scenario::Scenario;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, Node, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

const T: Duration = Duration::from_secs(30);

/// `kubectl` of `e2e/k8s/build.sh` (the version the real control plane runs); panics with what
/// to do when it is not built.
fn kubectl_path() -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("k8s/build.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("--print-bin-dir")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let k = PathBuf::from(&dir).join("kubectl");
    assert!(
        out.status.success() && k.is_file(),
        "kubectl is not built (looked for {}); build it with `bash e2e/k8s/build.sh` (Go >= 1.26)",
        k.display()
    );
    k.display().to_string()
}

async fn env_on(backend: Backend, nodes: usize) -> (TestEnv, String) {
    let k = kubectl_path();
    let e = TestEnv::start_on(
        backend,
        SimConfig {
            time_factor: 20.0,
            ..SimConfig::default()
        },
        nodes,
    )
    .await
    .expect("environment starts");
    if let Some(sim) = e.sim() {
        Scenario::from_yaml(&format!("nodes: {{count: {nodes}}}"))
            .unwrap()
            .load(&sim.api)
            .unwrap();
    }
    (e, k)
}

/// Runs kubectl; returns (success, stdout + stderr).
async fn kubectl(k: &str, env: &TestEnv, args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(k)
        .args(args)
        .env("KUBECONFIG", &env.kubeconfig)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("kubectl runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The cluster's node names, sorted.
async fn node_names(env: &TestEnv) -> Vec<String> {
    let nodes = Api::<Node>::all(env.client.clone());
    let list = nodes.list(&ListParams::default()).await.unwrap();
    let mut names: Vec<String> = list
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    names.sort();
    names
}

async fn ok(k: &str, env: &TestEnv, args: &[&str]) -> String {
    let (success, text) = kubectl(k, env, args).await;
    assert!(success, "kubectl {} failed:\n{text}", args.join(" "));
    text
}

const APP: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: nginx, resources: {requests: {cpu: 100m}}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data: {a: \"1\"}
";

ebb_e2e::on_both_backends! {
    /// apply (client-side, again, server-side), wait, get -o wide, label, taint, cordon, delete.
    async fn apply_get_label_taint_cordon_wait_delete(backend) {
    let (env, k) = env_on(backend, 2).await;
    let names = node_names(&env).await;
    let (n0, n1) = (names[0].as_str(), names[1].as_str());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.yaml");
    std::fs::write(&file, APP).unwrap();
    let f = file.to_str().unwrap();
    let out = ok(&k, &env, &["apply", "-f", f]).await;
    assert!(
        out.contains("deployment.apps/web created") && out.contains("configmap/cfg created"),
        "{out}"
    );
    let out = ok(&k, &env, &["apply", "-f", f]).await;
    assert!(out.contains("deployment.apps/web unchanged"), "{out}");
    let out = ok(&k, &env, &["apply", "--server-side", "-f", f]).await;
    assert!(
        out.contains("deployment.apps/web serverside-applied"),
        "{out}"
    );

    ok(
        &k,
        &env,
        &[
            "wait",
            "--for=condition=Available",
            "deployment/web",
            "--timeout=30s",
        ],
    )
    .await;
    let wide = ok(&k, &env, &["get", "pods", "-o", "wide", "-l", "app=web"]).await;
    let header: Vec<&str> = wide.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        &header[..7],
        &["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"],
        "{wide}"
    );
    let rows: Vec<&str> = wide.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{wide}");
    assert!(
        rows.iter()
            .all(|r| r.contains("1/1") && r.contains("Running") && r.contains("node-")),
        "{wide}"
    );
    let deploy = ok(&k, &env, &["get", "deployment", "web"]).await;
    assert!(
        deploy
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()[..4]
            == ["web", "2/2", "2", "2"],
        "{deploy}"
    );

    let nodes: Api<Node> = Api::all(env.client.clone());
    ok(&k, &env, &["label", "node", n0, "pool=blue"]).await;
    assert_eq!(
        nodes
            .get(n0)
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap()
            .get("pool")
            .map(String::as_str),
        Some("blue")
    );
    ok(
        &k,
        &env,
        &["taint", "node", n1, "dedicated=x:NoSchedule"],
    )
    .await;
    let taints = nodes
        .get(n1)
        .await
        .unwrap()
        .spec
        .unwrap()
        .taints
        .unwrap();
    assert!(taints.iter().any(|t| t.key == "dedicated"
        && t.value.as_deref() == Some("x")
        && t.effect == "NoSchedule"));
    ok(
        &k,
        &env,
        &["taint", "node", n1, "dedicated=x:NoSchedule-"],
    )
    .await;
    assert!(
        nodes
            .get(n1)
            .await
            .unwrap()
            .spec
            .unwrap()
            .taints
            .unwrap_or_default()
            .iter()
            .all(|t| t.key != "dedicated")
    );
    ok(&k, &env, &["cordon", n0]).await;
    assert_eq!(
        nodes
            .get(n0)
            .await
            .unwrap()
            .spec
            .unwrap()
            .unschedulable,
        Some(true)
    );
    let shown = ok(&k, &env, &["get", "nodes"]).await;
    assert!(shown.contains("Ready,SchedulingDisabled"), "{shown}");
    ok(&k, &env, &["uncordon", n0]).await;

    let out = ok(&k, &env, &["delete", "-f", f]).await;
    assert!(out.contains("deployment.apps \"web\" deleted"), "{out}");
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    // Garbage-collected: gone, or terminating (a real kubelet's grace period is 30 s).
    wait_for("web pods garbage-collected", T, || async {
        pods.list(&ListParams::default().labels("app=web"))
            .await
            .ok()
            .filter(|l| l.items.iter().all(|p| p.metadata.deletion_timestamp.is_some()))
            .map(|_| ())
    })
    .await
    .unwrap();
    let (found, text) = kubectl(&k, &env, &["get", "configmap", "cfg"]).await;
    assert!(!found && text.contains("NotFound"), "{text}");
}
}

ebb_e2e::on_both_backends! {
    /// `kubectl get -w` shows an object created while it watches.
    async fn get_watch_sees_a_change(backend) {
    let (env, k) = env_on(backend, 0).await;
    let mut child = tokio::process::Command::new(&k)
        .args(["get", "configmaps", "-w"])
        .env("KUBECONFIG", &env.kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(env.client.clone(), "default");
    let cm = serde_json::from_value(json!({"metadata": {"name": "watched"}, "data": {"x": "1"}}))
        .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let line = tokio::time::timeout(T, async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.starts_with("watched") {
                return l;
            }
        }
        panic!("kubectl get -w ended without showing the new object");
    })
    .await
    .expect("kubectl get -w shows the change");
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols[..2], ["watched", "1"], "name and DATA count: {line}");
    let _ = child.kill().await;
}
}

const DRAINED: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: nginx, resources: {requests: {cpu: 100m}}}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: web}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: default}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      containers: [{name: a, image: a}]
";

ebb_e2e::on_both_backends! {
    /// `kubectl drain` refuses a node with DaemonSet pods unless told to ignore them, then
    /// cordons the node and evicts its pods (protobuf Evictions), waiting on the PDB.
    async fn drain_moves_pods_and_waits_on_the_pdb(backend) {
        let (env, k) = env_on(backend, 2).await;
        let nodes_api: Api<Node> = Api::all(env.client.clone());
        let nodes = node_names(&env).await;
        let (first, second) = (nodes[0].clone(), nodes[1].clone());
        // Everything starts on the first node.
        let cordon = |v: Option<bool>| Patch::Merge(json!({"spec": {"unschedulable": v}}));
        nodes_api.patch(&second, &PatchParams::default(), &cordon(Some(true))).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("drained.yaml");
        std::fs::write(&file, DRAINED).unwrap();
        ok(&k, &env, &["apply", "-f", file.to_str().unwrap()]).await;
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), "default");
        let on = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let ready = |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        };
        let name_of = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
        // The DaemonSet pod must be on the first node too: without it the first drain below
        // would have nothing to refuse and would evict the web pods.
        wait_for("2 web pods ready and the agent pod on the first node", T, || async {
            let l = pods.list(&ListParams::default()).await.ok()?.items;
            let web = l.iter().filter(|p| name_of(p).starts_with("web-") && ready(p) && on(p) == first).count();
            let agents = l.iter().filter(|p| name_of(p).starts_with("agent") && on(p) == first).count();
            (web == 2 && agents == 1).then_some(())
        })
        .await
        .unwrap();
        let pdb: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), "default");
        wait_for("the PDB allows one disruption", T, || async {
            let s = pdb.get("web").await.ok()?.status?;
            (s.disruptions_allowed == 1).then_some(())
        })
        .await
        .unwrap();
        let (drained, text) = kubectl(&k, &env, &["drain", &first, "--timeout=10s"]).await;
        assert!(
            !drained && text.contains("DaemonSet-managed Pods"),
            "drain without --ignore-daemonsets refuses: {text}"
        );
        // The second node stays cordoned while the drain starts, so the first evicted pod's
        // replacement cannot run and the PDB must refuse the second eviction. (With room for
        // the replacement, a real API server may let the second eviction through once the
        // replacement is Ready: its eviction handler retries PDB conflicts for up to 10 s.)
        let drain = tokio::process::Command::new(&k)
            .args(["drain", &first, "--ignore-daemonsets", "--timeout=90s"])
            .env("KUBECONFIG", &env.kubeconfig)
            .stdin(Stdio::null())
            .output();
        let drain = tokio::spawn(drain);
        let refused = |audit: &[ebb_e2e::AuditRecord]| {
            audit.iter().any(|r| r.subresource == "eviction" && r.code == 429 && r.name.starts_with("web-"))
        };
        wait_for("the PDB refuses an eviction", T, || async { env.audit().ok().filter(|a| refused(a)) })
            .await
            .unwrap();
        nodes_api.patch(&second, &PatchParams::default(), &cordon(None)).await.unwrap();
        let out = drain.await.unwrap().expect("kubectl runs");
        let out = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(
            out.contains("Cannot evict pod as it would violate the pod's disruption budget"),
            "kubectl reported the PDB's refusal: {out}"
        );
        assert!(out.contains(&format!("node/{first} drained")), "{out}");
        let unsched = nodes_api.get(&first).await.unwrap().spec.and_then(|s| s.unschedulable);
        assert_eq!(unsched, Some(true), "drain cordoned the node");
        let l = pods.list(&ListParams::default().labels("app=web")).await.unwrap().items;
        let live: Vec<&Pod> = l.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        assert!(
            !live.is_empty() && live.iter().all(|p| on(p) == second),
            "web pods moved to {second}: {:?}",
            live.iter().map(|p| (name_of(p), on(p))).collect::<Vec<_>>()
        );
        let audit = env.audit().unwrap();
        let trail: Vec<String> = audit
            .iter()
            .filter(|r| r.subresource == "eviction")
            .map(|r| format!("{} {} {}", r.time, r.name, r.code))
            .collect();
        let evicted = audit.iter().filter(|r| r.subresource == "eviction" && r.code == 201 && r.name.starts_with("web-"));
        assert_eq!(evicted.count(), 2, "both web pods evicted:\n{}", trail.join("\n"));
        if let Some(sim) = env.sim() {
            assert!(sim.pdb_violations().is_empty(), "{:?}", sim.pdb_violations());
        }
    }
}

/// Tallies the everyday operations: each one's kubectl run and what it left in the cluster.
struct Tally {
    passed: Vec<String>,
    failed: Vec<String>,
}

impl Tally {
    fn check(&mut self, name: &str, good: bool, detail: &str) {
        if good {
            self.passed.push(name.to_string());
        } else {
            self.failed.push(format!("{name}: {detail}"));
        }
    }

    /// Runs kubectl; the step passes when it succeeds and `judge` accepts its output.
    async fn run(
        &mut self,
        k: &str,
        env: &TestEnv,
        args: &[&str],
        judge: impl FnOnce(&str) -> bool,
    ) -> String {
        let (success, out) = kubectl(k, env, args).await;
        let good = success && judge(&out);
        self.check(&args.join(" "), good, &out);
        out
    }
}

const EVERYDAY: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: app, namespace: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: app}}
  template:
    metadata: {labels: {app: app}}
    spec:
      containers: [{name: app, image: nginx, ports: [{containerPort: 80}], resources: {requests: {cpu: 100m}}}]
---
apiVersion: v1
kind: Service
metadata: {name: app, namespace: demo}
spec:
  selector: {app: app}
  ports: [{port: 80, targetPort: 80}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: app-cfg, namespace: demo}
data: {a: \"1\"}
";

const UNKNOWN_FIELD: &str = "apiVersion: v1
kind: ConfigMap
metadata: {name: bad, namespace: demo}
data: {a: \"1\"}
bogus: true
";

ebb_e2e::on_both_backends! {
    /// ~35 everyday kubectl operations, each judged by its output and the state it leaves; the
    /// tally is printed as `N passed, M failed`. kubectl sends protobuf bodies for `create`,
    /// `run`, `expose` and the evictions of `drain`.
    async fn everyday_operations(backend) {
        let (env, k) = env_on(backend, 3).await;
        let k = k.as_str();
        let c = env.client.clone();
        let mut nodes: Vec<String> = Api::<Node>::all(c.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        nodes.sort();
        let node = nodes.first().expect("nodes").clone();
        let dir = tempfile::tempdir().unwrap();
        let app = dir.path().join("app.yaml");
        std::fs::write(&app, EVERYDAY).unwrap();
        let app = app.to_str().unwrap();
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, UNKNOWN_FIELD).unwrap();
        let bad = bad.to_str().unwrap();
        let deploys: Api<Deployment> = Api::namespaced(c.clone(), "demo");
        let pods: Api<Pod> = Api::namespaced(c.clone(), "demo");
        let mut t = Tally { passed: vec![], failed: vec![] };

        t.run(k, &env, &["version"], |o| o.contains("Server Version")).await;
        t.run(k, &env, &["get", "nodes"], |o| o.contains(&node)).await;
        t.run(k, &env, &["create", "namespace", "demo", "-v=8"], |o| {
            o.contains("Content-Type: application/vnd.kubernetes.protobuf")
        })
        .await;
        let ns = Api::<Namespace>::all(c.clone()).get_opt("demo").await.unwrap();
        t.check("namespace demo exists", ns.is_some(), "not found");
        t.run(k, &env, &["create", "deployment", "web", "--image=nginx", "--replicas=2", "-n", "demo"], |_| true).await;
        let d = deploys.get_opt("web").await.unwrap();
        let spec = d.as_ref().and_then(|d| d.spec.clone());
        t.check(
            "deployment web: 2 replicas of nginx, RollingUpdate",
            spec.as_ref().is_some_and(|s| {
                s.replicas == Some(2)
                    && s.template.spec.as_ref().is_some_and(|p| p.containers[0].image.as_deref() == Some("nginx"))
                    && s.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("RollingUpdate")
            }),
            &format!("{spec:?}"),
        );
        t.run(k, &env, &["create", "configmap", "cfg", "--from-literal=a=1", "-n", "demo"], |_| true).await;
        let cm = Api::<ConfigMap>::namespaced(c.clone(), "demo").get_opt("cfg").await.unwrap();
        t.check(
            "configmap cfg has a=1",
            cm.as_ref().and_then(|c| c.data.as_ref()).and_then(|d| d.get("a")).map(String::as_str) == Some("1"),
            &format!("{cm:?}"),
        );
        t.run(k, &env, &["create", "secret", "generic", "sec", "--from-literal=p=x", "-n", "demo"], |_| true).await;
        let sec = Api::<Secret>::namespaced(c.clone(), "demo").get_opt("sec").await.unwrap();
        t.check(
            "secret sec has p=x",
            sec.as_ref().and_then(|s| s.data.as_ref()).and_then(|d| d.get("p")).map(|b| b.0.clone()) == Some(b"x".to_vec()),
            &format!("{sec:?}"),
        );
        t.run(k, &env, &["create", "serviceaccount", "bot", "-n", "demo"], |_| true).await;
        let sa = Api::<ServiceAccount>::namespaced(c.clone(), "demo").get_opt("bot").await.unwrap();
        t.check("serviceaccount bot exists", sa.is_some(), "not found");
        t.run(k, &env, &["create", "role", "r", "--verb=get", "--resource=pods", "-n", "demo"], |_| true).await;
        let role = Api::<Role>::namespaced(c.clone(), "demo").get_opt("r").await.unwrap();
        t.check(
            "role r lets get pods",
            role.as_ref().and_then(|r| r.rules.as_ref()).is_some_and(|rs| {
                rs.len() == 1 && rs[0].verbs == ["get"] && rs[0].resources.as_deref() == Some(&["pods".to_string()][..])
            }),
            &format!("{role:?}"),
        );
        t.run(k, &env, &["create", "rolebinding", "rb", "--role=r", "--serviceaccount=demo:bot", "-n", "demo"], |_| true).await;
        let rb = Api::<RoleBinding>::namespaced(c.clone(), "demo").get_opt("rb").await.unwrap();
        t.check(
            "rolebinding rb binds bot to r",
            rb.as_ref().is_some_and(|b| {
                b.role_ref.name == "r"
                    && b.subjects.as_ref().is_some_and(|s| s.len() == 1 && s[0].kind == "ServiceAccount" && s[0].name == "bot")
            }),
            &format!("{rb:?}"),
        );
        t.run(k, &env, &["create", "poddisruptionbudget", "web", "--selector=app=web", "--min-available=1", "-n", "demo"], |_| true).await;
        let pdb = Api::<PodDisruptionBudget>::namespaced(c.clone(), "demo").get_opt("web").await.unwrap();
        t.check(
            "pdb web: minAvailable 1",
            pdb.as_ref().and_then(|p| p.spec.as_ref()).and_then(|s| s.min_available.clone())
                == Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)),
            &format!("{pdb:?}"),
        );
        t.run(k, &env, &["create", "job", "j", "--image=busybox", "-n", "demo"], |_| true).await;
        let job = Api::<Job>::namespaced(c.clone(), "demo").get_opt("j").await.unwrap();
        t.check(
            "job j runs busybox",
            job.as_ref().and_then(|j| j.spec.as_ref()).and_then(|s| s.template.spec.as_ref())
                .is_some_and(|p| p.containers[0].image.as_deref() == Some("busybox")),
            &format!("{job:?}"),
        );
        t.run(k, &env, &["run", "p", "--image=nginx", "-n", "demo"], |_| true).await;
        let p = pods.get_opt("p").await.unwrap();
        t.check(
            "pod p runs nginx",
            p.as_ref().and_then(|p| p.spec.as_ref()).is_some_and(|s| s.containers[0].image.as_deref() == Some("nginx")),
            &format!("{p:?}"),
        );

        t.run(k, &env, &["apply", "-f", app], |o| o.contains("deployment.apps/app created")).await;
        let svc = Api::<Service>::namespaced(c.clone(), "demo").get_opt("app").await.unwrap();
        t.check(
            "applied service app on port 80",
            svc.as_ref().and_then(|s| s.spec.as_ref()).and_then(|s| s.ports.as_ref()).is_some_and(|p| p[0].port == 80),
            &format!("{svc:?}"),
        );
        t.run(k, &env, &["apply", "-f", app], |o| o.contains("deployment.apps/app unchanged")).await;
        t.run(k, &env, &["apply", "--server-side", "-f", app], |o| o.contains("deployment.apps/app serverside-applied")).await;
        let (accepted, out) = kubectl(k, &env, &["apply", "-f", bad]).await;
        t.check(
            "apply with an unknown field is refused",
            !accepted && out.contains("strict decoding error: unknown field \"bogus\""),
            &out,
        );
        let cms = Api::<ConfigMap>::namespaced(c.clone(), "demo");
        t.check("the refused configmap is not stored", cms.get_opt("bad").await.unwrap().is_none(), "stored");
        t.run(k, &env, &["apply", "--validate=false", "-f", bad], |o| o.contains("configmap/bad created")).await;
        let stored = t.run(k, &env, &["get", "configmap", "bad", "-n", "demo", "-o", "json"], |_| true).await;
        let stored: serde_json::Value = serde_json::from_str(&stored).unwrap_or_default();
        t.check(
            "without validation the unknown field is dropped",
            stored["data"]["a"] == "1" && stored.get("bogus").is_none(),
            &stored.to_string(),
        );

        t.run(k, &env, &["get", "deploy,svc,cm,secret,sa,pdb", "-n", "demo"], |o| o.contains("deployment.apps/web")).await;
        t.run(k, &env, &["describe", "deployment", "web", "-n", "demo"], |o| o.contains("Replicas:") && o.contains("nginx")).await;
        t.run(k, &env, &["rollout", "status", "deployment/web", "-n", "demo", "--timeout=60s"], |o| o.contains("successfully rolled out")).await;
        let ready = deploys.get("web").await.ok().and_then(|d| d.status).and_then(|s| s.ready_replicas);
        t.check("web has 2 ready replicas", ready == Some(2), &format!("{ready:?}"));
        t.run(k, &env, &["get", "pods", "-n", "demo", "-o", "wide", "-l", "app=web"], |o| o.lines().filter(|l| l.starts_with("web-")).count() == 2).await;
        t.run(k, &env, &["scale", "deployment", "web", "--replicas=3", "-n", "demo"], |o| o.contains("scaled")).await;
        let replicas = deploys.get("web").await.ok().and_then(|d| d.spec).and_then(|s| s.replicas);
        t.check("web scaled to 3", replicas == Some(3), &format!("{replicas:?}"));
        t.run(k, &env, &["label", "deployment", "web", "tier=front", "-n", "demo"], |_| true).await;
        t.run(k, &env, &["annotate", "deployment", "web", "note=hi", "-n", "demo"], |_| true).await;
        let meta = deploys.get("web").await.ok().map(|d| d.metadata);
        t.check(
            "web labelled and annotated",
            meta.as_ref().is_some_and(|m| {
                m.labels.as_ref().and_then(|l| l.get("tier")).map(String::as_str) == Some("front")
                    && m.annotations.as_ref().and_then(|a| a.get("note")).map(String::as_str) == Some("hi")
            }),
            &format!("{meta:?}"),
        );
        t.run(k, &env, &["get", "deployment", "web", "-n", "demo", "-o", "jsonpath={.spec.replicas}"], |o| o.trim() == "3").await;
        t.run(k, &env, &["set", "image", "deployment/web", "nginx=nginx:1.27", "-n", "demo"], |_| true).await;
        t.run(k, &env, &["rollout", "restart", "deployment/web", "-n", "demo"], |_| true).await;
        let tpl = deploys.get("web").await.ok().and_then(|d| d.spec).map(|s| s.template);
        t.check(
            "web's template: new image and a restart annotation",
            tpl.as_ref().is_some_and(|t| {
                t.spec.as_ref().is_some_and(|s| s.containers[0].image.as_deref() == Some("nginx:1.27"))
                    && t.metadata.as_ref().and_then(|m| m.annotations.as_ref())
                        .is_some_and(|a| a.contains_key("kubectl.kubernetes.io/restartedAt"))
            }),
            &format!("{tpl:?}"),
        );
        t.run(k, &env, &["expose", "deployment", "web", "--port=80", "-n", "demo"], |_| true).await;
        let svc = Api::<Service>::namespaced(c.clone(), "demo").get_opt("web").await.unwrap();
        t.check(
            "exposed service web selects app=web on port 80",
            svc.as_ref().and_then(|s| s.spec.as_ref()).is_some_and(|s| {
                s.ports.as_ref().is_some_and(|p| p[0].port == 80)
                    && s.selector.as_ref().and_then(|l| l.get("app")).map(String::as_str) == Some("web")
            }),
            &format!("{svc:?}"),
        );
        t.run(k, &env, &["explain", "deployment.spec.replicas"], |o| o.contains("FIELD: replicas <integer>")).await;
        t.run(k, &env, &["explain", "deployment", "--output=plaintext-openapiv2"], |o| o.contains("Deployment enables declarative updates")).await;
        t.run(k, &env, &["api-resources"], |o| o.contains("deployments")).await;

        t.run(k, &env, &["cordon", &node], |_| true).await;
        let unsched = Api::<Node>::all(c.clone()).get(&node).await.ok().and_then(|n| n.spec).and_then(|s| s.unschedulable);
        t.check("node cordoned", unsched == Some(true), &format!("{unsched:?}"));
        t.run(k, &env, &["rollout", "status", "deployment/web", "-n", "demo", "--timeout=60s"], |_| true).await;
        let evictions_before = env.audit().map(|a| a.iter().filter(|r| r.subresource == "eviction").count()).unwrap_or(0);
        let on_node = |l: &[Pod]| {
            l.iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()))
                .count()
        };
        let before = pods.list(&ListParams::default()).await.map(|l| on_node(&l.items)).unwrap_or(0);
        t.run(k, &env, &["drain", &node, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=60s"], |o| o.contains("drained")).await;
        let after = pods.list(&ListParams::default()).await.map(|l| on_node(&l.items)).unwrap_or(usize::MAX);
        let evictions = env.audit().map(|a| a.iter().filter(|r| r.subresource == "eviction" && r.code == 201).count()).unwrap_or(0);
        t.check(
            "drain evicted the node's pods",
            after == 0 && (before == 0 || evictions > evictions_before),
            &format!("{before} pods before, {after} after, {evictions} accepted evictions"),
        );
        t.run(k, &env, &["uncordon", &node], |_| true).await;
        let unsched = Api::<Node>::all(c.clone()).get(&node).await.ok().and_then(|n| n.spec).and_then(|s| s.unschedulable);
        t.check("node uncordoned", unsched != Some(true), &format!("{unsched:?}"));
        t.run(k, &env, &["get", "events", "-n", "demo"], |_| true).await;
        t.run(k, &env, &["delete", "deployment", "web", "-n", "demo"], |o| o.contains("deleted")).await;
        t.check("deployment web gone", deploys.get_opt("web").await.unwrap().is_none(), "still there");
        t.run(k, &env, &["delete", "namespace", "demo", "--timeout=60s"], |o| o.contains("deleted")).await;
        let ns = Api::<Namespace>::all(c.clone()).get_opt("demo").await.unwrap();
        t.check("namespace demo gone", ns.is_none(), &format!("{ns:?}"));

        println!("everyday kubectl operations: {} passed, {} failed", t.passed.len(), t.failed.len());
        assert!(t.failed.is_empty(), "failed on {backend:?}:\n{}", t.failed.join("\n---\n"));
    }
}

ebb_e2e::on_both_backends! {
    /// kubectl's default field validation (Strict) against unknown fields of a built-in kind and
    /// of ebb's CRD, on create, on a client-side apply to an existing object (a patch) and on a
    /// server-side apply; `--validate=warn` creates the object without the field and warns.
    async fn unknown_fields_are_refused_as_a_real_server_does(backend) {
        let (env, k) = env_on(backend, 0).await;
        let k = k.as_str();
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let good = write("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: default}\ndata: {a: \"1\"}\n");
        let bad = write("cm-bad.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: default, bogus: 1}\ndata: {a: \"2\"}\n");
        let crds = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds");
        let policy_bad = write("sdp-bad.yaml", "apiVersion: ebb.dev/v1alpha1\nkind: ScaleDownPolicy\nmetadata: {name: p}\nspec: {bogusField: 1}\n");

        let (ok_, out) = kubectl(k, &env, &["create", "-f", &bad]).await;
        assert!(!ok_ && out.contains("Error from server (BadRequest)")
            && out.contains("ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"metadata.bogus\""), "{out}");
        ok(k, &env, &["apply", "-f", &good]).await;
        let (ok_, out) = kubectl(k, &env, &["apply", "-f", &bad]).await;
        assert!(!ok_ && out.contains("The request is invalid: patch: Invalid value:")
            && out.contains("strict decoding error: unknown field \"metadata.bogus\""), "{out}");
        let (ok_, out) = kubectl(k, &env, &["apply", "--server-side", "-f", &bad]).await;
        assert!(!ok_ && out.contains(
            "failed to create typed patch object (default/c; /v1, Kind=ConfigMap): .metadata.bogus: field not declared in schema"), "{out}");
        let cm: ConfigMap = Api::namespaced(env.client.clone(), "default").get("c").await.unwrap();
        assert_eq!(cm.data.unwrap()["a"], "1", "no refused write changed the object");
        ok(k, &env, &["delete", "configmap", "c"]).await;
        let out = ok(k, &env, &["create", "--validate=warn", "-f", &bad]).await;
        assert!(out.contains("Warning: unknown field \"metadata.bogus\""), "{out}");
        let raw = ok(k, &env, &["get", "configmap", "c", "-o", "json"]).await;
        let raw: serde_json::Value = serde_json::from_str(&raw).unwrap();
        assert!(raw["metadata"].get("bogus").is_none() && raw["data"]["a"] == "2", "{raw}");

        ok(k, &env, &["apply", "-f", crds.to_str().unwrap()]).await;
        ok(k, &env, &["wait", "--for=condition=Established", "crd/scaledownpolicies.ebb.dev", "--timeout=30s"]).await;
        // The CRD is served (discovery refreshed) once a get of its kind answers.
        wait_for("ScaleDownPolicy served", T, || async {
            kubectl(k, &env, &["get", "scaledownpolicies"]).await.0.then_some(())
        })
        .await
        .unwrap();
        let (ok_, out) = kubectl(k, &env, &["apply", "-f", &policy_bad]).await;
        assert!(!ok_ && out.contains(
            "ScaleDownPolicy in version \"v1alpha1\" cannot be handled as a ScaleDownPolicy: strict decoding error: unknown field \"spec.bogusField\""), "{out}");
        let (ok_, out) = kubectl(k, &env, &["apply", "--server-side", "-f", &policy_bad]).await;
        assert!(!ok_ && out.contains(".spec.bogusField: field not declared in schema"), "{out}");
        let (found, _) = kubectl(k, &env, &["get", "scaledownpolicy", "p"]).await;
        assert!(!found, "a refused policy is not stored");
    }
}
