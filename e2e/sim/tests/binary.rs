//! The `ebb-sim` binary as a child process: applies the generated CRDs and
//! the demo scenario, writes a kubeconfig, serves kube-rs and kubectl (CRD printer columns), and
//! dies on `kill -9`.

use std::path::PathBuf;
use std::time::Duration;

use ebb_sim::poll::wait_for;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams};

#[tokio::test]
async fn ebb_sim_binary_serves_the_demo() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let out = dir.join("child.kubeconfig");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let crds = root.join("crds");
    let demo = root.join("e2e/scenarios/demo.yaml");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ebb-sim"))
        .args([
            "serve",
            "--time-factor",
            "20",
            "--apply",
            crds.to_str().unwrap(),
            "--scenario",
            demo.to_str().unwrap(),
            "--kubeconfig-out",
            out.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let text = wait_for("kubeconfig written", Duration::from_secs(30), || async {
        std::fs::read_to_string(&out).ok()
    })
    .await
    .unwrap();
    let client = ebb_sim::sim::client_from_yaml(&text).await.unwrap();
    let nss: Api<Namespace> = Api::all(client.clone());
    assert!(nss.get("shop").await.is_ok());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    wait_for("13 demo pods running", Duration::from_secs(30), || async {
        let l = pods
            .list(&ListParams::default().fields("status.phase=Running"))
            .await
            .ok()?;
        (l.items.len() == 13).then_some(())
    })
    .await
    .unwrap();
    let groups = client.list_api_groups().await.unwrap();
    assert!(
        groups.groups.iter().any(|g| g.name == "ebb.dev"),
        "CRDs from crds/ are served"
    );

    {
        // The kubectl of e2e/k8s/build.sh, the version the real control plane runs.
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../k8s/build.sh");
        let bin_dir = std::process::Command::new("bash")
            .arg(&script)
            .arg("--print-bin-dir")
            .output()
            .unwrap();
        let kubectl = std::path::PathBuf::from(String::from_utf8_lossy(&bin_dir.stdout).trim())
            .join("kubectl");
        assert!(
            kubectl.is_file(),
            "kubectl is not built (looked for {}); build it with `bash e2e/k8s/build.sh`",
            kubectl.display()
        );
        let policy = dir.join("policy.yaml");
        std::fs::write(&policy, "apiVersion: ebb.dev/v1alpha1\nkind: ScaleDownPolicy\nmetadata: {name: demo}\nspec: {}\n").unwrap();
        let run = |args: Vec<String>| {
            std::process::Command::new(&kubectl)
                .args(args)
                .env("KUBECONFIG", &out)
                .output()
                .unwrap()
        };
        let o = run(vec![
            "apply".into(),
            "-f".into(),
            policy.display().to_string(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = run(vec!["get".into(), "scaledownpolicies".into()]);
        let table = String::from_utf8_lossy(&o.stdout).to_string();
        let header = table.lines().next().unwrap_or_default().to_string();
        assert!(
            header.starts_with("NAME") && header.contains("MODE") && header.contains("AGE"),
            "printer columns: {table}"
        );
        assert!(
            table.lines().nth(1).unwrap_or_default().contains("DryRun"),
            "{table}"
        );
    }

    let pid = child.id();
    child.kill().await.unwrap();
    assert!(pid.is_some());
    let gone = client.list_api_groups().await;
    assert!(gone.is_err(), "the server is gone after kill -9");
}
