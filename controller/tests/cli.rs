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
