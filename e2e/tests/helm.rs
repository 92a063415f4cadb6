//! Helm against ebb-sim and a real control plane: the real Helm library (Python package
//! `helm-sdkpy`) installs a small chart, waits for it to be ready, and stores its release Secret.
//! Fails, saying how to install it, when python3 or helm-sdkpy is missing.

use std::path::PathBuf;
use std::time::Duration;

use ebb_e2e::SimConfig;
use ebb_e2e::harness::{TestEnv, wait_for};
use ebb_e2e::scenario::Scenario;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{Api, ListParams};

ebb_e2e::on_both_backends! {
async fn helm_installs_a_chart(backend) {
    let helm = std::process::Command::new("python3")
        .args(["-c", "import helm_sdkpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        helm,
        "python3 with helm-sdkpy is not installed; `make test` installs it (pip install --ignore-requires-python helm-sdkpy)"
    );
    // Two nodes for the Deployment's two replicas: ebb-sim's, or kwok's.
    let env = TestEnv::start_on(
        backend,
        SimConfig {
            time_factor: 20.0,
            ..SimConfig::default()
        },
        2,
    )
    .await
    .unwrap();
    if let Some(sim) = env.sim() {
        Scenario::from_yaml("nodes: {count: 2}")
            .unwrap()
            .load(&sim.api)
            .unwrap();
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/helm");
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .arg(dir.join("install.py"))
            .arg(&env.kubeconfig)
            .arg(dir.join("demo"))
            .arg("demo")
            .output(),
    )
    .await
    .expect("helm install finishes within 120s")
    .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "helm install failed:\n{stdout}\n{stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(
        report
            .pointer("/status/info/status")
            .and_then(|s| s.as_str()),
        Some("deployed"),
        "{report}"
    );

    let c = env.client.clone();
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "default");
    let rel = secrets
        .list(&ListParams::default().labels("owner=helm,name=demo"))
        .await
        .unwrap()
        .items;
    assert_eq!(rel.len(), 1, "one release secret");
    assert_eq!(
        rel[0].metadata.name.as_deref(),
        Some("sh.helm.release.v1.demo.v1")
    );
    assert_eq!(rel[0].type_.as_deref(), Some("helm.sh/release.v1"));
    let cm = Api::<ConfigMap>::namespaced(c.clone(), "default")
        .get("demo-config")
        .await
        .unwrap();
    assert_eq!(
        cm.data.unwrap().get("message").map(String::as_str),
        Some("from-test")
    );
    let svc = Api::<Service>::namespaced(c.clone(), "default")
        .get("demo")
        .await
        .unwrap();
    assert!(
        svc.spec
            .unwrap()
            .cluster_ip
            .is_some_and(|ip| ip.starts_with("10.96."))
    );
    let deploys: Api<Deployment> = Api::namespaced(c.clone(), "default");
    wait_for("demo deployment ready", Duration::from_secs(20), || async {
        let d = deploys.get("demo").await.ok()?;
        (d.status?.ready_replicas == Some(2)).then_some(())
    })
    .await
    .unwrap();
}
}
