//! The release workflow (`.github/workflows/release.yml`) cannot run here: actionlint checks it
//! (syntax, expressions, action inputs, the shell of its steps when shellcheck is there), and
//! this test checks it builds and pushes what docs/install.md says: both platforms from
//! `images/build.sh`, every platform pushed, the chart pushed as an OCI artifact.
//!
//! actionlint is built from its Go module at a pinned version (`make test` installs it).

use std::path::{Path, PathBuf};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn workflow_path() -> PathBuf {
    repo().join(".github/workflows/release.yml")
}

/// actionlint: `EBB_ACTIONLINT`, else on `PATH`, else in Go's bin directory.
fn actionlint() -> PathBuf {
    if let Some(p) = std::env::var_os("EBB_ACTIONLINT") {
        return PathBuf::from(p);
    }
    if let Ok(p) = ebb_e2e::harness::which("actionlint") {
        return p;
    }
    let gopath = std::process::Command::new("go")
        .args(["env", "GOPATH"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let p = Path::new(&gopath).join("bin/actionlint");
    assert!(
        p.is_file(),
        "actionlint is needed: go install github.com/rhysd/actionlint/cmd/actionlint@v1.7.12 \
         (`make test` installs it), or set EBB_ACTIONLINT"
    );
    p
}

fn run_actionlint(file: &Path) -> (bool, String) {
    let out = std::process::Command::new(actionlint())
        .args(["-no-color", "-oneline"])
        .arg(file)
        .current_dir(repo())
        .output()
        .expect("actionlint runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn actionlint_accepts_the_release_workflow() {
    let (ok, out) = run_actionlint(&workflow_path());
    assert!(ok, "actionlint on .github/workflows/release.yml:\n{out}");
}

#[test]
fn actionlint_refuses_a_broken_workflow() {
    // The same workflow with a step calling an output no step sets and a job needing one that
    // does not exist: actionlint must say so, or the test above proves nothing.
    let text = std::fs::read_to_string(workflow_path()).unwrap();
    let broken = text.replacen("needs: images", "needs: image", 1).replacen(
        "steps.version.outputs.version",
        "steps.versio.outputs.version",
        1,
    );
    assert_ne!(broken, text);
    let dir = tempfile::tempdir().unwrap();
    let wf = dir.path().join(".github/workflows");
    std::fs::create_dir_all(&wf).unwrap();
    std::fs::write(wf.join("release.yml"), broken).unwrap();
    let (ok, out) = run_actionlint(&wf.join("release.yml"));
    assert!(!ok, "actionlint accepted a broken workflow:\n{out}");
    assert!(out.contains("image"), "{out}");
}

#[test]
fn the_release_builds_both_platforms_and_pushes_every_one_and_the_chart() {
    let text = std::fs::read_to_string(workflow_path()).unwrap();
    let wf: Value = serde_saphyr::from_str(&text).unwrap();
    let runs = |job: &str| -> String {
        wf["jobs"][job]["steps"]
            .as_array()
            .unwrap_or_else(|| panic!("job {job} has steps"))
            .iter()
            .filter_map(|s| s["run"].as_str())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let images = runs("images");
    assert!(images.contains("images/build.sh"), "{images}");
    assert!(
        images.contains("EBB_IMAGE_PLATFORMS=linux/amd64,linux/arm64"),
        "{images}"
    );
    assert!(
        images.contains("aarch64-unknown-linux-musl") && images.contains("cargo-zigbuild"),
        "the arm64 toolchain is installed: {images}"
    );
    assert!(
        images.contains("skopeo copy --all"),
        "every platform pushed: {images}"
    );
    for name in ["ebb-controller", "ebb-node-agent"] {
        assert!(images.contains(name), "{name} pushed: {images}");
    }
    let chart = runs("chart");
    assert!(chart.contains("helm package charts/ebb"), "{chart}");
    assert!(
        chart.contains("helm push") && chart.contains("oci://"),
        "{chart}"
    );
    assert_eq!(wf["permissions"]["packages"], "write");
    // Pinned versions of the arm64 toolchain: the same as the test command installs.
    let test_sh = std::fs::read_to_string(repo().join("hack/test.sh")).unwrap();
    for var in ["ZIGBUILD_VERSION", "ZIGLANG_VERSION"] {
        let in_wf = wf["env"][var].as_str().unwrap_or_default().to_string();
        assert!(
            !in_wf.is_empty() && test_sh.contains(&format!("{var}={in_wf}")),
            "{var} is {in_wf:?} in the workflow and hack/test.sh"
        );
    }
}
