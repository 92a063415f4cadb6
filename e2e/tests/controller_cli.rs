//! `ebb-controller run` as a user starts it by hand, out of a cluster: where its Lease goes when
//! no namespace is given, and how a failure to start reads.

use std::process::Stdio;
use std::time::Duration;

use ebb_e2e::SimConfig;
use ebb_e2e::harness::{TestEnv, wait_for, workspace_binary};
use ebb_e2e::setup::strip_ansi;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::io::AsyncReadExt;

/// `ebb-controller run` with the test cluster's admin kubeconfig and `args`.
fn controller(env: &TestEnv, args: &[&str]) -> tokio::process::Child {
    let path = workspace_binary("ebb-controller").expect("ebb-controller is built");
    tokio::process::Command::new(path)
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--identity",
            "by-hand",
        ])
        .args(args)
        .env("KUBECONFIG", &env.kubeconfig)
        .env("EBB_LOG_FORMAT", "text")
        .env_remove("POD_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("ebb-controller starts")
}

ebb_e2e::on_both_backends! {
    /// Without `--namespace` (and no `POD_NAMESPACE`) the Lease goes to the kubeconfig context's
    /// namespace, else `default`, as kubectl would; a namespace that does not exist stops the
    /// controller with one line per cause, the API server's answer once.
    async fn run_by_hand_defaults_the_namespace_and_reports_each_cause_once(backend) {
        let env = TestEnv::start_on(backend, SimConfig::default(), 1).await.expect("environment starts");

        let mut missing = controller(&env, &["--namespace", "no-such-ns"]);
        let status = tokio::time::timeout(Duration::from_secs(60), missing.wait())
            .await
            .expect("the controller stops by itself")
            .expect("waiting for the controller");
        assert!(!status.success(), "a missing Lease namespace is an error");
        let mut stderr = String::new();
        missing.stderr.take().unwrap().read_to_string(&mut stderr).await.unwrap();
        let stderr = strip_ansi(&stderr);
        // The report is the end of stderr, after the log lines.
        let start = stderr.find("\nerror: ").expect("an error report on stderr");
        let stderr = &stderr[start + 1..];
        let answer = "namespaces \"no-such-ns\" not found";
        assert_eq!(stderr.matches(answer).count(), 1, "the API server's answer once:\n{stderr}");
        assert!(
            stderr.contains("error: cannot use Lease no-such-ns/ebb-controller"),
            "names the Lease:\n{stderr}"
        );
        assert!(stderr.contains("caused by: "), "the cause on its own line:\n{stderr}");
        assert!(!stderr.contains("Status {"), "no debug dump:\n{stderr}");

        let _running = controller(&env, &[]);
        let leases: Api<Lease> = Api::namespaced(env.client.clone(), "default");
        // kube-lease-manager creates the Lease, then takes it.
        wait_for("the Lease in namespace default, held by this replica", Duration::from_secs(60), || async {
            let lease = leases.get_opt("ebb-controller").await.ok().flatten()?;
            let holder = lease.spec?.holder_identity?;
            (holder == "by-hand").then_some(())
        })
        .await
        .unwrap();
    }
}
