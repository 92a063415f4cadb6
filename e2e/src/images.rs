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

/// Runs `images/build.sh` (a no-op when nothing changed, a release build of both binaries
/// for `x86_64-unknown-linux-musl` when something did) and returns what it built. Fails with the
/// script's last lines, which name what is missing (the musl target, musl-gcc, buildah).
pub async fn build() -> anyhow::Result<Images> {
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
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
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
