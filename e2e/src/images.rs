//! ebb's container images as `images/build.sh` builds them (static musl binaries, buildah, OCI
//! archives), for the tests that run them on a real node: build when stale, then name them.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, bail};

/// One build of both images: the OCI archives and the names inside them.
#[derive(Clone, Debug)]
pub struct Images {
    /// `images/build.sh`'s output directory.
    pub dir: PathBuf,
    /// The references, `<registry>/<name>:<tag>`, of ebb-controller and ebb-node-agent.
    pub controller: String,
    pub node_agent: String,
    /// The OCI archives holding them.
    pub archives: Vec<PathBuf>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/build.sh")
}

/// What the images are built from: when one of these is newer than the last build, they are
/// built again.
const INPUTS: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "api",
    "controller",
    "node-agent",
    "telemetry",
    "images/Dockerfile",
    "images/build.sh",
    "charts/ebb/Chart.yaml",
    "charts/ebb/values.yaml",
];

/// The newest modification time under `path` (files only; `target` directories skipped).
fn newest(path: &Path) -> Option<std::time::SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_file() {
        return meta.modified().ok();
    }
    std::fs::read_dir(path)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_name() != "target")
        .filter_map(|e| newest(&e.path()))
        .max()
}

/// The images of the last `images/build.sh`, when none of [`INPUTS`] changed since.
async fn current() -> Option<Images> {
    let out = tokio::process::Command::new("bash")
        .arg(script())
        .arg("--print-dir")
        .output()
        .await
        .ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let built = std::fs::metadata(dir.join(".stamp"))
        .ok()?
        .modified()
        .ok()?;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let changed = INPUTS
        .iter()
        .filter_map(|i| newest(&repo.join(i)))
        .any(|t| t > built);
    if changed {
        return None;
    }
    read(dir).ok()
}

/// The images of the current sources: those of the last `images/build.sh` when nothing they
/// are built from changed since (so the test command's build is reused), else what `images/build.sh`
/// builds now (a release build of both binaries for `x86_64-unknown-linux-musl` where
/// something changed). Fails with the script's last lines, which name what is missing (the musl
/// target, musl-gcc, buildah).
pub async fn build() -> anyhow::Result<Images> {
    if let Some(images) = current().await {
        return Ok(images);
    }
    let out = tokio::process::Command::new("bash")
        .arg(script())
        .stdin(Stdio::null())
        .output()
        .await
        .context("cannot run images/build.sh")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "images/build.sh failed ({}):\n{}",
            out.status,
            tail.join("\n")
        );
    }
    read(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The images `images/build.sh` left in `dir`.
fn read(dir: PathBuf) -> anyhow::Result<Images> {
    let sizes = std::fs::read_to_string(dir.join("sizes.txt"))
        .with_context(|| format!("images/build.sh wrote no {}/sizes.txt", dir.display()))?;
    let reference = |name: &str| {
        sizes
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .find(|r| {
                r.rsplit('/')
                    .next()
                    .is_some_and(|n| n.starts_with(&format!("{name}:")))
            })
            .map(str::to_string)
            .with_context(|| format!("{}/sizes.txt names no {name} image", dir.display()))
    };
    Ok(Images {
        controller: reference("ebb-controller")?,
        node_agent: reference("ebb-node-agent")?,
        archives: vec![
            dir.join("ebb-controller.oci.tar"),
            dir.join("ebb-node-agent.oci.tar"),
        ],
        dir,
    })
}
