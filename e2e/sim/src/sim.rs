//! The `Sim` handle: starts the API server (and the simulated cluster) on 127.0.0.1, hands out
//! kubeconfigs and kube clients, and lets tests drive time and read the records.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::{Api, AuditRecord, PdbViolation};
use crate::clock::Clock;

/// How to start a simulator.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// 0 picks a free port.
    pub port: u16,
    /// Sim time runs this many times faster than real time.
    pub time_factor: f64,
    /// Run the simulated cluster (scheduler, kubelet, controllers); off gives a bare API server.
    pub cluster: bool,
    /// Watch events kept per resource for resume; older resourceVersions get `410 Gone`.
    pub history_limit: usize,
    /// Keep the audit log.
    pub audit: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            port: 0,
            time_factor: 1.0,
            cluster: true,
            history_limit: 10_000,
            audit: true,
        }
    }
}

impl SimConfig {
    /// A bare API server: no scheduler, kubelet or controllers.
    pub fn api_only() -> Self {
        Self {
            cluster: false,
            ..Self::default()
        }
    }
}

/// A running simulator. Dropping it stops the server and the cluster tasks.
pub struct Sim {
    pub api: Arc<Api>,
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Sim {
    /// Starts the API server (and, if configured, the simulated cluster).
    pub async fn start(cfg: SimConfig) -> anyhow::Result<Self> {
        let clock = Arc::new(Clock::new(cfg.time_factor));
        let api = Arc::new(Api::new(clock, cfg.history_limit));
        api.records().audit_off = !cfg.audit;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", cfg.port))
            .await
            .with_context(|| {
                format!(
                    "cannot listen on 127.0.0.1:{}: pick another --port or use 0 for a free one",
                    cfg.port
                )
            })?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let app = crate::server::router(api.clone());
        let mut tasks = vec![tokio::spawn(async move {
            let r = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
            if let Err(e) = r {
                tracing::error!(error = %e, "ebb-sim server stopped");
            }
        })];
        if cfg.cluster {
            tasks.push(crate::cluster::spawn(api.clone()));
        }
        tracing::info!(url = %format!("http://{addr}"), cluster = cfg.cluster, time_factor = cfg.time_factor, "ebb-sim serving");
        Ok(Self {
            api,
            addr,
            shutdown: Some(tx),
            tasks,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig for this server; each user in `users` gets a context and a token naming it
    /// (the first is the current context).
    pub fn kubeconfig_yaml(&self, users: &[&str]) -> String {
        kubeconfig_yaml(&self.url(), users)
    }

    /// Writes a kubeconfig file (see [`Self::kubeconfig_yaml`]).
    pub fn write_kubeconfig(&self, path: &Path, users: &[&str]) -> anyhow::Result<()> {
        write_atomically(path, &self.kubeconfig_yaml(users))
            .with_context(|| format!("cannot write kubeconfig {}", path.display()))
    }

    /// A kube client acting as `admin`.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        self.client_as("admin").await
    }

    /// A kube client acting as `user` (its token names the user in the audit log).
    pub async fn client_as(&self, user: &str) -> anyhow::Result<kube::Client> {
        client_from_yaml(&self.kubeconfig_yaml(&[user])).await
    }

    pub fn audit(&self) -> Vec<AuditRecord> {
        self.api.records().audit.clone()
    }

    pub fn pdb_violations(&self) -> Vec<PdbViolation> {
        self.api.records().violations.clone()
    }

    /// The audit log as text, one write per line.
    pub fn audit_text(&self) -> String {
        self.audit()
            .iter()
            .map(|r| {
                format!(
                    "{} {} {} {}{} {}/{} -> {}",
                    r.time,
                    r.user,
                    r.verb,
                    r.resource,
                    if r.subresource.is_empty() {
                        String::new()
                    } else {
                        format!("/{}", r.subresource)
                    },
                    r.namespace,
                    r.name,
                    r.code
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Jumps sim time forward and wakes the cluster.
    pub fn advance(&self, d: Duration) {
        self.api.clock.advance(d);
        self.api.changed.notify_waiters();
    }

    pub fn set_time_factor(&self, f: f64) {
        self.api.clock.set_factor(f);
        self.api.changed.notify_waiters();
    }

    /// Makes a node's kubelet stop (`ready = false`: NotReady, unreachable taints, its pods not
    /// ready and, after their tolerations, evicted) or come back.
    pub fn set_node_ready(&self, node: &str, ready: bool) -> anyhow::Result<()> {
        let ri = self
            .api
            .resolve("", "v1", "nodes")
            .context("nodes are not served")?;
        let ann = crate::cluster::annotations::NODE_DOWN;
        let body = if ready {
            serde_json::json!({"metadata": {"annotations": {ann: null}}})
        } else {
            serde_json::json!({"metadata": {"annotations": {ann: "true"}}})
        };
        let ctx = crate::api::Ctx::system("ebb-sim");
        self.api
            .patch(
                &ctx,
                &ri,
                "",
                node,
                "",
                crate::api::PatchKind::Merge,
                body.to_string().as_bytes(),
            )
            .with_context(|| format!("cannot mark node {node} ready={ready}"))?;
        Ok(())
    }

    /// Forgets watch history: watches resuming from older versions get `410 Gone`.
    pub fn compact(&self) {
        self.api.compact();
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A kubeconfig for `url`, one context per user with a token naming the user.
pub fn kubeconfig_yaml(url: &str, users: &[&str]) -> String {
    let users: Vec<&str> = if users.is_empty() {
        vec!["admin"]
    } else {
        users.to_vec()
    };
    let mut s = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ebb-sim\n  cluster:\n    server: {url}\ncontexts:\n"
    );
    for u in &users {
        s.push_str(&format!(
            "- name: {u}\n  context:\n    cluster: ebb-sim\n    user: {u}\n    namespace: default\n"
        ));
    }
    s.push_str(&format!("current-context: {}\nusers:\n", users[0]));
    for u in &users {
        s.push_str(&format!("- name: {u}\n  user:\n    token: {u}\n"));
    }
    s
}

/// A kube client from kubeconfig text (its current context). kube's default retry of `429`
/// answers is turned off, so tests see an eviction refused by a PodDisruptionBudget at once.
pub async fn client_from_yaml(yaml: &str) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::from_yaml(yaml).context("invalid kubeconfig")?;
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .context("cannot build a client config from the kubeconfig")?;
    cfg.default_retry = false;
    Ok(kube::Client::try_from(cfg)?)
}

/// Writes `path` beside itself and renames it into place: a process that starts while the file
/// is rewritten (another binary of the same user being spawned) reads the old or the new file,
/// never a truncated one.
pub fn write_atomically(path: &Path, contents: &str) -> std::io::Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp-{}-{n}", std::process::id()));
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}
