//! CRD validation by a real kube-apiserver: every CEL rule and a schema bound of each kind
//! (numbers, patterns, enums, list sizes), applied with the real kubectl, must be refused with
//! the rule's message, and a valid object of each kind accepted.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use ebb_e2e::harness::{TestEnv, wait_for};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// `kubectl apply -f -` of `obj` (with kubectl's own schema validation, as a user runs it);
/// `Ok(stdout)` or `Err(stderr)`.
async fn kubectl_apply(kubectl: &Path, kubeconfig: &Path, obj: &Value) -> Result<String, String> {
    let mut child = tokio::process::Command::new(kubectl)
        .args(["apply", "-f", "-"])
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the kubectl built with the control plane starts");
    let mut stdin = child.stdin.take().expect("kubectl's stdin");
    stdin.write_all(obj.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn sdp(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "ebb.dev/v1alpha1", "kind": "ScaleDownPolicy",
           "metadata": {"name": name}, "spec": spec})
}

fn ph(name: &str, roles: Value, extra: Value) -> Value {
    let mut spec = json!({"selector": {"matchLabels": {"app": "db"}}, "roleLabel": "role",
                          "roles": roles});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    json!({"apiVersion": "ebb.dev/v1alpha1", "kind": "PlacementHistory",
           "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

fn nst(name: &str, node: &str) -> Value {
    json!({"apiVersion": "ebb.dev/v1alpha1", "kind": "NodeState",
           "metadata": {"name": name}, "spec": {"nodeName": node}})
}

fn resource(name: &str, url: &str, sha: &str) -> Value {
    json!({"name": name, "url": url, "sha256": sha})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_api_server_enforces_every_rule_and_bound() {
    let env = TestEnv::start_real(0).await.unwrap();
    let real = env.real().expect("a real control plane");
    let kubectl = real.kubectl().unwrap();
    let kubeconfig = real.kubeconfig();
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds");
    let out = tokio::process::Command::new(&kubectl)
        .args(["apply", "-f"])
        .arg(&crds)
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A new CRD is served (and published in /openapi/v3, which kubectl validates with) shortly
    // after it is Established.
    let valid = [
        sdp("ok", json!({"mode": "DryRun"})),
        ph("ok", json!([{"name": "a"}]), json!({})),
        nst("n1", "n1"),
    ];
    for obj in &valid {
        wait_for(
            &format!("a valid {} to be accepted", obj["kind"]),
            Duration::from_secs(30),
            || async { kubectl_apply(&kubectl, &kubeconfig, obj).await.ok() },
        )
        .await
        .unwrap();
    }
    let sha = "a".repeat(64);
    let cases: Vec<(&str, Value, &str)> = vec![
        // CEL rules
        (
            "drain parallelism above the total",
            sdp(
                "p1",
                json!({"maxScaleDownParallelism": 5, "maxDrainParallelism": 6}),
            ),
            "maxDrainParallelism cannot exceed maxScaleDownParallelism",
        ),
        (
            "a removal with mode Drain",
            sdp(
                "p9",
                json!({"mode": "Drain", "removal": {"method": "ClusterAPI"}}),
            ),
            "mode Drain keeps its nodes, so it cannot have a removal",
        ),
        (
            "an unknown removal method",
            sdp(
                "p10",
                json!({"mode": "DrainAndDelete", "removal": {"method": "Terraform"}}),
            ),
            "Unsupported value: \"Terraform\"",
        ),
        (
            "budget schedule without duration",
            sdp(
                "p2",
                json!({"budgets": [{"nodes": "10%", "schedule": "0 9 * * 1-5"}]}),
            ),
            "schedule and duration must be set together",
        ),
        (
            "no roles",
            ph("h1", json!([]), json!({})),
            "roles must list at least one role",
        ),
        (
            "duplicate roles",
            ph("h2", json!([{"name": "a"}, {"name": "a"}]), json!({})),
            "role names must be unique",
        ),
        (
            "failure threshold below -1",
            ph(
                "h3",
                json!([{"name": "a", "nodeFailureThreshold": -2}]),
                json!({}),
            ),
            "nodeFailureThreshold must be -1",
        ),
        (
            "duplicate local resources",
            ph(
                "h4",
                json!([{"name": "a", "localResources": [
                    resource("x", "https://example.invalid/x", &sha),
                    resource("x", "https://example.invalid/y", &sha)]}]),
                json!({}),
            ),
            "localResources names must be unique within a role",
        ),
        (
            "cache retention over 30 days",
            ph(
                "h5",
                json!([{"name": "a"}]),
                json!({"cacheRetention": "31d"}),
            ),
            "cacheRetention must be at most 30d",
        ),
        ("changed nodeName", nst("n1", "n2"), "nodeName is immutable"),
        // schema bounds, patterns and enums
        (
            "utilisation above 1",
            sdp("p3", json!({"utilizationThreshold": 1.5})),
            "utilizationThreshold",
        ),
        (
            "zero scale-down parallelism",
            sdp("p4", json!({"maxScaleDownParallelism": 0})),
            "maxScaleDownParallelism",
        ),
        (
            "a duration in words",
            sdp("p5", json!({"unneededTime": "ten minutes"})),
            "unneededTime",
        ),
        (
            "a budget of 150%",
            sdp("p6", json!({"budgets": [{"nodes": "150%"}]})),
            "nodes",
        ),
        (
            "an unknown mode",
            sdp("p7", json!({"mode": "Delete"})),
            "Unsupported value: \"Delete\"",
        ),
        (
            "65 roles",
            ph(
                "h6",
                Value::Array((0..65).map(|i| json!({"name": format!("r{i}")})).collect()),
                json!({}),
            ),
            "must have at most 64 items",
        ),
        (
            "an ftp URL",
            ph(
                "h7",
                json!([{"name": "a", "localResources": [resource("x", "ftp://example.invalid/x", &sha)]}]),
                json!({}),
            ),
            "url",
        ),
        (
            "a short digest",
            ph(
                "h8",
                json!([{"name": "a", "localResources": [resource("x", "https://example.invalid/x", "abc")]}]),
                json!({}),
            ),
            "sha256",
        ),
    ];
    let mut failures = Vec::new();
    for (what, obj, message) in &cases {
        match kubectl_apply(&kubectl, &kubeconfig, obj).await {
            Ok(out) => failures.push(format!("{what}: accepted ({})", out.trim())),
            Err(err) if !err.contains(message) => failures.push(format!(
                "{what}: refused without {message:?}: {}",
                err.trim()
            )),
            Err(err) => eprintln!("{what}: {}", err.trim()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
