//! The `ebb-controller` binary as a user runs it.

use std::process::Command;

fn ebb() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ebb-controller"))
}

#[test]
fn crds_prints_what_the_crds_directory_holds() {
    let out = ebb().arg("crds").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 3, "three CRD files in crds/");
    let on_disk: String = files
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        on_disk,
        "crds/ is stale: run `cargo run -p ebb-controller -- crds --out-dir crds`"
    );
}

#[test]
fn crds_out_dir_writes_one_file_per_kind() {
    let dir = tempfile::tempdir().unwrap();
    let out = ebb()
        .args(["crds", "--out-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    for name in [
        "scaledownpolicies.ebb.dev.yaml",
        "placementhistories.ebb.dev.yaml",
        "nodestates.ebb.dev.yaml",
    ] {
        let text = std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert!(
            text.starts_with(
                "---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
            ),
            "{name}"
        );
    }
}

#[test]
fn help_explains_every_subcommand() {
    let out = ebb().arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for sub in ["run", "plan", "crds"] {
        assert!(help.contains(sub), "{help}");
    }
    let out = ebb().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(
        help.contains("EBB_METRICS_ADDR") && help.contains("--leader-election"),
        "{help}"
    );
}

/// Text logs read from a pipe (a pod's log, `kubectl logs`, a file) are plain text: no terminal
/// colour codes. The controller is started against an API server that is not there; its first
/// log line comes before it connects.
#[test]
fn text_logs_in_a_pipe_have_no_colour_codes() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n\
         users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
         current-context: x\n",
    )
    .unwrap();
    let mut child = ebb()
        .args([
            "run",
            "--log-format",
            "text",
            "--log-filter",
            "info",
            "--leader-election",
            "false",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("NO_COLOR")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    let read = stderr.read_line(&mut first);
    let _ = child.kill();
    let _ = child.wait();
    read.unwrap();
    assert!(
        first.contains("INFO") && first.contains("Lease and token Secret namespace"),
        "the first log line: {first:?}"
    );
    assert!(
        !first.contains('\u{1b}'),
        "a log line written to a pipe holds terminal escape codes: {first:?}"
    );
}
