//! kubectl against the simulator: apply, get -o wide, get -w, label, taint, cordon, drain with
//! a PodDisruptionBudget to wait on, wait --for=condition, delete. Skips with a notice when
//! kubectl is not installed.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use ebb_e2e::SimConfig;
use ebb_e2e::harness::{TestEnv, wait_for};
use ebb_e2e::scenario::Scenario;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

const T: Duration = Duration::from_secs(30);

fn kubectl_path() -> Option<String> {
    let candidates = ["/usr/bin/kubectl", "/usr/local/bin/kubectl"];
    if let Some(c) = candidates.iter().find(|c| Path::new(c).exists()) {
        return Some(c.to_string());
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("kubectl"))
            .find(|c| c.is_file())
            .map(|c| c.display().to_string())
    })
}

async fn env() -> Option<(TestEnv, String)> {
    let Some(k) = kubectl_path() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "kubectl is not installed (looked in /usr/bin, /usr/local/bin and PATH); CI needs it"
        );
        eprintln!(
            "SKIPPED: kubectl is not installed (looked in /usr/bin, /usr/local/bin and PATH)"
        );
        return None;
    };
    let e = TestEnv::start(SimConfig {
        time_factor: 20.0,
        ..SimConfig::default()
    })
    .await
    .expect("environment starts");
    Some((e, k))
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

#[tokio::test]
async fn apply_get_label_taint_cordon_wait_delete() {
    let Some((env, k)) = env().await else { return };
    if let Some(sim) = env.sim() {
        Scenario::from_yaml("nodes: {count: 2}")
            .unwrap()
            .load(&sim.api)
            .unwrap();
    }
    let file = env.kubeconfig.with_file_name("app.yaml");
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
    ok(&k, &env, &["label", "node", "node-0", "pool=blue"]).await;
    assert_eq!(
        nodes
            .get("node-0")
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
        &["taint", "node", "node-1", "dedicated=x:NoSchedule"],
    )
    .await;
    let taints = nodes
        .get("node-1")
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
        &["taint", "node", "node-1", "dedicated=x:NoSchedule-"],
    )
    .await;
    assert!(
        nodes
            .get("node-1")
            .await
            .unwrap()
            .spec
            .unwrap()
            .taints
            .unwrap_or_default()
            .iter()
            .all(|t| t.key != "dedicated")
    );
    ok(&k, &env, &["cordon", "node-0"]).await;
    assert_eq!(
        nodes
            .get("node-0")
            .await
            .unwrap()
            .spec
            .unwrap()
            .unschedulable,
        Some(true)
    );
    let shown = ok(&k, &env, &["get", "nodes"]).await;
    assert!(shown.contains("Ready,SchedulingDisabled"), "{shown}");
    ok(&k, &env, &["uncordon", "node-0"]).await;

    let out = ok(&k, &env, &["delete", "-f", f]).await;
    assert!(out.contains("deployment.apps \"web\" deleted"), "{out}");
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    wait_for("web pods garbage-collected", T, || async {
        pods.list(&ListParams::default().labels("app=web"))
            .await
            .ok()
            .filter(|l| l.items.is_empty())
            .map(|_| ())
    })
    .await
    .unwrap();
    let (found, text) = kubectl(&k, &env, &["get", "configmap", "cfg"]).await;
    assert!(!found && text.contains("NotFound"), "{text}");
}

#[tokio::test]
async fn get_watch_sees_a_change() {
    let Some((env, k)) = env().await else { return };
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

#[tokio::test]
async fn drain_moves_pods_and_waits_on_the_pdb() {
    let Some((env, k)) = env().await else { return };
    let Some(sim) = env.require_sim("drain_moves_pods_and_waits_on_the_pdb") else {
        return;
    };
    Scenario::from_yaml("nodes: {count: 2}")
        .unwrap()
        .load(&sim.api)
        .unwrap();
    let nodes: Api<Node> = Api::all(env.client.clone());
    // Everything starts on node-0.
    nodes
        .patch(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    Scenario::from_yaml(
        "deployments: {count: 1, namePrefix: web-, replicas: 2, pdb: {minAvailable: 1}}",
    )
    .unwrap()
    .load(&sim.api)
    .unwrap();
    let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {"metadata": {"labels": {"app": "agent"}},
            "spec": {"containers": [{"name": "a", "image": "a"}]}}}});
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(ds).unwrap();
    Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(env.client.clone(), "default")
        .create(&PostParams::default(), &ds)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let on = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    };
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    wait_for("2 web pods ready on node-0 and the agent", T, || async {
        let l = pods.list(&ListParams::default()).await.ok()?.items;
        let web = l
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("web-0")
                    && ready(p)
                    && on(p) == "node-0"
            })
            .count();
        let agents = l
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("agent")
            })
            .count();
        (web == 2 && agents >= 1).then_some(())
    })
    .await
    .unwrap();
    nodes
        .patch(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": null}})),
        )
        .await
        .unwrap();

    let (refused, text) = kubectl(&k, &env, &["drain", "node-0", "--timeout=10s"]).await;
    assert!(
        !refused && text.contains("DaemonSet-managed Pods"),
        "drain without --ignore-daemonsets refuses: {text}"
    );
    let out = ok(
        &k,
        &env,
        &["drain", "node-0", "--ignore-daemonsets", "--timeout=60s"],
    )
    .await;
    assert!(
        out.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "the second eviction waited on the PDB: {out}"
    );
    assert!(out.contains("node/node-0 drained"), "{out}");
    let l = pods
        .list(&ListParams::default().labels("app=web-0"))
        .await
        .unwrap()
        .items;
    let live: Vec<&Pod> = l
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    assert!(
        live.iter().all(|p| on(p) == "node-1"),
        "web pods moved to node-1"
    );
    assert!(
        sim.pdb_violations().is_empty(),
        "{:?}",
        sim.pdb_violations()
    );
    assert!(
        sim.audit()
            .iter()
            .filter(|r| r.subresource == "eviction" && r.code == 429)
            .count()
            >= 1
    );
}
