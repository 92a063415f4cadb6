//! A container registry on loopback (Debian's `docker-registry`, CNCF Distribution) for the tests
//! that install ebb as users do: images pushed with `skopeo`, pulled by the real node's containerd.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{free_port, wait_for, which};

/// A running registry, stopped when dropped. Serves plain HTTP on `127.0.0.1`, so containerd
/// is told to use HTTP for it ([`LocalRegistry::trust_from`]).
pub struct LocalRegistry {
    /// `127.0.0.1:<port>`: the registry part of an image reference.
    pub host: String,
    log: PathBuf,
    child: tokio::process::Child,
}

impl LocalRegistry {
    /// Starts `docker-registry serve` with its storage and log under `dir`, and waits until it
    /// answers `GET /v2/`.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let bin = which("docker-registry").context(
            "docker-registry is needed for the registry test (Debian: apt-get install \
             docker-registry; `make test` installs it)",
        )?;
        which("skopeo").context(
            "skopeo is needed to push images to the test registry (Debian: apt-get install \
             skopeo; `make test` installs it)",
        )?;
        std::fs::create_dir_all(dir.join("data"))
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let port = free_port()?;
        let host = format!("127.0.0.1:{port}");
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                 http:\n  addr: {host}\n",
                dir.join("data").display()
            ),
        )
        .context("cannot write the registry's configuration")?;
        let log = dir.join("registry.log");
        let out = std::fs::File::create(&log).context("cannot create the registry's log")?;
        let err = out.try_clone().context("cannot share the registry's log")?;
        let child = tokio::process::Command::new(bin)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start docker-registry")?;
        let registry = Self { host, log, child };
        let probe = registry.host.clone();
        if let Err(e) = wait_for(
            "the test registry answers /v2/",
            Duration::from_secs(30),
            || {
                let host = probe.clone();
                async move { get_status(&host, "/v2/").await.filter(|s| *s == 200) }
            },
        )
        .await
        {
            bail!("{e}; its log:\n{}", registry.log_text());
        }
        Ok(registry)
    }

    /// Copies the image (or image index: every platform) in the OCI archive `archive` to
    /// `<host>/<repository>:<tag>`; returns that reference.
    pub async fn push(
        &self,
        archive: &Path,
        repository: &str,
        tag: &str,
    ) -> anyhow::Result<String> {
        let reference = format!("{}/{repository}:{tag}", self.host);
        let out = tokio::process::Command::new("skopeo")
            .args(["copy", "--all", "--dest-tls-verify=false", "--quiet"])
            .arg(format!("oci-archive:{}", archive.display()))
            .arg(format!("docker://{reference}"))
            .stdin(Stdio::null())
            .output()
            .await
            .context("cannot run skopeo")?;
        if !out.status.success() {
            bail!(
                "skopeo copy {} to {reference} failed: {}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(reference)
    }

    /// Tells a containerd whose CRI `registry.config_path` is `certs_d` to pull from this
    /// registry over plain HTTP (containerd reads the directory at every pull).
    pub fn trust_from(&self, certs_d: &Path) -> anyhow::Result<()> {
        let dir = certs_d.join(&self.host);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"http://{h}\"\n\n[host.\"http://{h}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n",
                h = self.host
            ),
        )
        .context("cannot write containerd's hosts.toml for the test registry")
    }

    /// How many times a manifest of `repository` was fetched (`GET .../manifests/...` in the
    /// access log): the proof that a pull came from here.
    pub fn manifest_pulls(&self, repository: &str) -> usize {
        let needle = format!("GET /v2/{repository}/manifests/");
        self.log_text()
            .lines()
            .filter(|l| l.contains(&needle))
            .count()
    }

    /// The registry's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the registry process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// The HTTP status of `GET path` on `host` (plain HTTP/1.0), None when it does not answer.
async fn get_status(host: &str, path: &str) -> Option<u16> {
    let mut s = tokio::net::TcpStream::connect(host).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).await.ok()?;
    let line = std::str::from_utf8(&head[..n]).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}
