//! The e2e harness: a test environment on either backend (a fresh ebb-sim, or a real control
//! plane started from `e2e/k8s/`, or the cluster of `EBB_E2E_KUBECONFIG`); helpers to run the
//! workspace binaries as child processes, wait for conditions, and read either audit log.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use ebb_sim::sim::{Sim, SimConfig, client_from_yaml};

/// The environment variable naming a real cluster's kubeconfig.
pub const REAL_CLUSTER_ENV: &str = "EBB_E2E_KUBECONFIG";

/// The two clusters an e2e test runs on. Tests declared with [`crate::on_both_backends!`] run
/// once on each, as `<test>::sim` and `<test>::real`; pick one backend with a name filter
/// (`cargo test -p ebb-e2e -- ::real`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// ebb-sim, in process: fast, with time control and fault injection.
    Sim,
    /// A real control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok) of the
    /// test's own, or the cluster of `EBB_E2E_KUBECONFIG` when that is set.
    Real,
}

/// Declares async e2e tests that run on both backends. Each
/// `async fn name(backend) { ... }` becomes a module `name` with two tests, `sim` and `real`,
/// whose body sees `backend: Backend`. Attributes (doc comments, `#[ignore]`) apply to both.
#[macro_export]
macro_rules! on_both_backends {
    () => {};
    ($(#[$attr:meta])* async fn $name:ident($backend:ident) $body:block $($rest:tt)*) => {
        $(#[$attr])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sim() {
                let $backend = $crate::harness::Backend::Sim;
                $body
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn real() {
                let $backend = $crate::harness::Backend::Real;
                $body
            }
        }
        $crate::on_both_backends! { $($rest)* }
    };
}

/// A test's cluster: a simulator or a real cluster.
pub struct TestEnv {
    sim: Option<Sim>,
    real: Option<RealCluster>,
    pub client: kube::Client,
    /// A kubeconfig file for child processes and kubectl.
    pub kubeconfig: PathBuf,
    /// On a real cluster, the chart's identities once applied (by the first spawn of a binary).
    rbac: std::sync::Mutex<Option<crate::rbac::ChartRbac>>,
    _dir: tempfile::TempDir,
}

impl TestEnv {
    /// Starts `backend`: a simulator with `cfg`, or a real control plane with `real_nodes` kwok
    /// nodes (`kwok-node-0..`). With `EBB_E2E_KUBECONFIG` set, `Real` connects to that cluster
    /// instead of starting one.
    pub async fn start_on(
        backend: Backend,
        cfg: SimConfig,
        real_nodes: usize,
    ) -> anyhow::Result<Self> {
        match backend {
            Backend::Real => {
                if let Ok(path) = std::env::var(REAL_CLUSTER_ENV) {
                    return Self::connect(&path).await;
                }
                Self::start_real(real_nodes).await
            }
            Backend::Sim => Self::start_sim(cfg).await,
        }
    }

    async fn connect(path: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {REAL_CLUSTER_ENV}={path}"))?;
        let client = client_from_yaml(&text).await?;
        Ok(Self {
            sim: None,
            real: None,
            client,
            kubeconfig: PathBuf::from(path),
            rbac: Default::default(),
            _dir: dir,
        })
    }

    async fn start_sim(cfg: SimConfig) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
        let sim = Sim::start(cfg).await?;
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig, &["admin", "ebb-controller", "ebb-node-agent"])?;
        let client = sim.client().await?;
        Ok(Self {
            sim: Some(sim),
            real: None,
            client,
            kubeconfig,
            rbac: Default::default(),
            _dir: dir,
        })
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        if self.sim.is_some() {
            Backend::Sim
        } else {
            Backend::Real
        }
    }

    /// Every write the API server recorded so far, oldest first: ebb-sim's audit records, or
    /// the real kube-apiserver's audit log (`DIR/audit.log`, see `e2e/k8s/cluster.sh` for what
    /// its policy records). Fails on a cluster of `EBB_E2E_KUBECONFIG`, whose log it cannot read.
    pub fn audit(&self) -> anyhow::Result<Vec<ebb_sim::AuditRecord>> {
        if let Some(sim) = &self.sim {
            return Ok(sim.audit());
        }
        match &self.real {
            Some(real) => crate::audit::read(&real.dir().join("audit.log")),
            None => bail!(
                "the audit log of the cluster in {REAL_CLUSTER_ENV} cannot be read; run this test \
                 on a control plane the suite starts (unset {REAL_CLUSTER_ENV})"
            ),
        }
    }

    /// A real control plane of its own (built and started by `e2e/k8s/`) with `nodes` kwok
    /// nodes, even with `EBB_E2E_KUBECONFIG` set: for tests of what only a real API server does
    /// (admission policies, RBAC, CEL). Fails, naming what is missing, when it cannot be built.
    pub async fn start_real(nodes: usize) -> anyhow::Result<Self> {
        Self::start_real_cluster(RealCluster::up(nodes).await?).await
    }

    /// Like [`Self::start_real`], with a real node beside the kwok nodes: containerd, a kubelet
    /// and kube-proxy (`cluster.sh up --real-node`, built by `build.sh node`), on which pods
    /// really run. Needs root, containerd, runc, the CNI plugins and iptables; fails naming
    /// what is missing.
    pub async fn start_real_with_node(nodes: usize) -> anyhow::Result<Self> {
        Self::start_real_cluster(RealCluster::up_with_node(nodes).await?).await
    }

    async fn start_real_cluster(real: RealCluster) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
        let kubeconfig = real.kubeconfig();
        let text = std::fs::read_to_string(&kubeconfig)
            .with_context(|| format!("cannot read {}", kubeconfig.display()))?;
        let client = client_from_yaml(&text).await?;
        Ok(Self {
            sim: None,
            real: Some(real),
            client,
            kubeconfig,
            rbac: Default::default(),
            _dir: dir,
        })
    }

    /// The real control plane, if this test started one.
    pub fn real(&self) -> Option<&RealCluster> {
        self.real.as_ref()
    }

    /// The simulator, if this is one.
    pub fn sim(&self) -> Option<&Sim> {
        self.sim.as_ref()
    }

    /// Starts a workspace binary (`ebb-controller`, `ebb-node-agent`, `ebb-sim`) with `args`,
    /// `KUBECONFIG` pointing at this environment (as `admin` on a simulator).
    pub fn spawn_binary(&self, name: &str, args: &[&str]) -> anyhow::Result<ChildProcess> {
        self.spawn_binary_as("admin", name, args)
    }

    /// Like [`Self::spawn_binary`], acting as `user` on a simulator (its writes show that user
    /// in the audit log). On a real cluster `ebb-controller` and `ebb-node-agent` run with the
    /// chart's ServiceAccounts, whatever `user` says: a TokenRequest token of `ebb-controller` or
    /// `ebb-node-agent` (bound to the agent's `--node-name` Node) under the chart's roles, which
    /// are applied on the first spawn (see [`crate::rbac`]); other binaries get the admin's
    /// kubeconfig. [`Self::audit_user`] gives the name the audit log records. A controller on a
    /// real cluster serves the steering webhook ([`steering_args`]).
    pub fn spawn_binary_as(
        &self,
        user: &str,
        name: &str,
        args: &[&str],
    ) -> anyhow::Result<ChildProcess> {
        let path = workspace_binary(name)?;
        let kubeconfig = self.binary_kubeconfig(user, name, args)?;
        let steering = steering_args(self.backend(), name, args)?;
        let child = tokio::process::Command::new(&path)
            .args(args)
            .args(&steering)
            .env("KUBECONFIG", &kubeconfig)
            .envs(child_env())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", path.display()))?;
        Ok(ChildProcess {
            name: name.to_string(),
            child,
        })
    }
}

impl TestEnv {
    /// The user name the audit log records for a binary spawned as `user`: `user` on a
    /// simulator; on a real cluster the chart's ServiceAccount of `ebb-controller` and
    /// `ebb-node-agent` (`system:serviceaccount:ebb-system:<account>`), else the admin
    /// (`kubernetes-admin`).
    pub fn audit_user(&self, user: &str) -> String {
        if self.sim.is_some() {
            return user.to_string();
        }
        match crate::rbac::account_of(user) {
            Some(account) => crate::rbac::username(account),
            None => "kubernetes-admin".to_string(),
        }
    }

    /// The kubeconfig [`Self::spawn_binary_as`] gives binary `name` run with `args` as `user`,
    /// for a test that starts the binary itself.
    pub fn binary_kubeconfig(
        &self,
        user: &str,
        name: &str,
        args: &[&str],
    ) -> anyhow::Result<PathBuf> {
        match &self.sim {
            Some(sim) => {
                let file = self._dir.path().join(format!("kubeconfig-{user}"));
                sim.write_kubeconfig(&file, &[user])?;
                Ok(file)
            }
            None => self.chart_kubeconfig(name, args),
        }
    }

    /// On a real cluster, the kubeconfig binary `name` runs with (see [`Self::spawn_binary_as`]).
    fn chart_kubeconfig(&self, name: &str, args: &[&str]) -> anyhow::Result<PathBuf> {
        let Some(account) = crate::rbac::account_of(name) else {
            return Ok(self.kubeconfig.clone());
        };
        let node = if account == "ebb-node-agent" {
            Some(crate::rbac::node_name_in(args).context(
                "on a real cluster the node agent's token is bound to its Node: pass --node-name",
            )?)
        } else {
            None
        };
        let mut rbac = self.rbac.lock().unwrap_or_else(|e| e.into_inner());
        let installed = match rbac.take() {
            Some(r) => r,
            None => {
                let kubectl = match &self.real {
                    Some(real) => real.kubectl()?,
                    None => PathBuf::from("kubectl"),
                };
                crate::rbac::ChartRbac::install(&kubectl, &self.kubeconfig, self._dir.path())
                    .context("cannot give the binaries the chart's identities")?
            }
        };
        let file = installed.kubeconfig_for(account, node.as_deref());
        *rbac = Some(installed);
        file
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(sim) = &self.sim
        {
            let text = sim.audit_text();
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(300);
            eprintln!(
                "---- ebb-sim audit log (last {} of {} writes) ----",
                lines.len() - start,
                lines.len()
            );
            for l in &lines[start..] {
                eprintln!("{l}");
            }
            for v in sim.pdb_violations() {
                eprintln!("PDB VIOLATION: {v:?}");
            }
        }
    }
}

/// A running child process; killed when dropped.
pub struct ChildProcess {
    pub name: String,
    pub child: tokio::process::Child,
}

impl ChildProcess {
    /// `kill -9`, then waits for it to go.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child
            .kill()
            .await
            .with_context(|| format!("cannot kill {}", self.name))
    }

    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// Reads the child's stdout and stderr into a shared list of lines (so its pipes never
    /// fill), for a test to search or print when it fails.
    pub fn capture_output(&mut self) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        self.capture_output_into(&log, "", None);
        log
    }

    /// Reads the child's stdout and stderr into `log`, each line after `prefix`; with `keep`,
    /// the older half of the lines is dropped whenever there are more than `keep`.
    pub fn capture_output_into(
        &mut self,
        log: &std::sync::Arc<std::sync::Mutex<Vec<String>>>,
        prefix: &str,
        keep: Option<usize>,
    ) {
        use tokio::io::AsyncBufReadExt;
        let out = self.child.stdout.take();
        let err = self.child.stderr.take();
        for pipe in [
            out.map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            err.map(|e| Box::new(e) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let log = log.clone();
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(pipe).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                    log.push(format!("{prefix}{l}"));
                    if let Some(keep) = keep
                        && log.len() > keep
                    {
                        log.drain(..keep / 2);
                    }
                }
            });
        }
    }
}

/// Environment every binary started by [`TestEnv::spawn_binary_as`] gets on top of the test's
/// own (for example `OTEL_EXPORTER_OTLP_ENDPOINT`); process-wide, set with [`set_child_env`].
static CHILD_ENV: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// Give every binary spawned from now on `key=value` (replacing an earlier value of `key`).
pub fn set_child_env(key: &str, value: &str) {
    let mut env = CHILD_ENV.lock().unwrap_or_else(|e| e.into_inner());
    env.retain(|(k, _)| k != key);
    env.push((key.to_string(), value.to_string()));
}

fn child_env() -> Vec<(String, String)> {
    CHILD_ENV.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Finds a binary of this workspace next to the running test executable
/// (`target/<profile>/<name>`; tests run from `target/<profile>/deps/`).
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the test executable")?;
    let mut dirs: Vec<&Path> = Vec::new();
    if let Some(d) = exe.parent() {
        dirs.push(d);
        if let Some(p) = d.parent() {
            dirs.push(p);
        }
    }
    for d in dirs {
        let candidate = d.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "binary {name} not found next to {}: build it first (cargo build -p <its package>; `cargo test --workspace` builds all binaries)",
        exe.display()
    )
}

/// Polls `check` until it returns `Some`, or fails naming `what` after `timeout` as stretched
/// by [`scaled`] for how busy the machine is now.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    ebb_sim::poll::wait_for(what, scaled(timeout), check)
        .await
        .map_err(anyhow::Error::msg)
}

/// `timeout` for this machine now: times its one-minute load average over its CPU count (at
/// least 1, at most 4), and times `EBB_E2E_PATIENCE` when set. Waits end as soon as what they
/// wait for happens, so an idle machine runs no slower; a loaded one (a build beside the suite)
/// gets time in proportion instead of a flake.
pub fn scaled(timeout: Duration) -> Duration {
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let patience = std::env::var("EBB_E2E_PATIENCE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|p| *p >= 1.0)
        .unwrap_or(1.0);
    timeout.mul_f64(load_factor(load, cpus) * patience)
}

/// The load factor of [`scaled`]: load per CPU, between 1 and 4 (1 when the load is unknown).
fn load_factor(load: Option<f64>, cpus: f64) -> f64 {
    load.map_or(1.0, |l| (l / cpus.max(1.0)).clamp(1.0, 4.0))
}

/// A real control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok) built by
/// `e2e/k8s/build.sh` and started by `e2e/k8s/cluster.sh`; stopped when dropped.
pub struct RealCluster {
    dir: tempfile::TempDir,
}

/// One build at a time in this process (tests run on parallel threads).
static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A script of `e2e/k8s/` (`build.sh`, `cluster.sh`).
pub fn k8s_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s").join(name)
}

/// Runs a script, passing its output through; fails with its last lines when it fails.
async fn run_script(script: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("bash")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("cannot run {}", script.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "{} {} failed ({}):\n{}",
            script.display(),
            args.join(" "),
            out.status,
            tail.join("\n")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl RealCluster {
    /// Builds the control plane when it is not cached (tens of minutes cold, under a second
    /// warm), then starts one with `nodes` kwok nodes (`kwok-node-0..`).
    pub async fn up(nodes: usize) -> anyhow::Result<Self> {
        Self::build(&[]).context(
            "the real control plane could not be built (it needs Go 1.26+ and the Go module \
             proxy; see e2e/k8s/README.md)",
        )?;
        Self::start(nodes, false).await
    }

    /// Like [`Self::up`], with a real node (`cluster.sh up --real-node`): builds the kubelet,
    /// kube-proxy and the pause image when they are not cached (`build.sh node`).
    pub async fn up_with_node(nodes: usize) -> anyhow::Result<Self> {
        Self::build(&[]).context(
            "the real control plane could not be built (it needs Go 1.26+ and the Go module \
             proxy; see e2e/k8s/README.md)",
        )?;
        Self::build(&["node"]).context(
            "the real node could not be built (kubelet and kube-proxy need Go 1.26+, the pause \
             image musl-gcc and buildah; see e2e/k8s/README.md)",
        )?;
        Self::start(nodes, true).await
    }

    /// `build.sh ARGS`, one build at a time in this process.
    fn build(args: &[&str]) -> anyhow::Result<()> {
        let _one = BUILD.lock().unwrap_or_else(|e| e.into_inner());
        let build = k8s_script("build.sh");
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(run_script(&build, args))
        })?;
        Ok(())
    }

    async fn start(nodes: usize, real_node: bool) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("ebb-k8s-")
            .tempdir()
            .context("cannot create a directory for the control plane")?;
        let path = dir.path().to_string_lossy().into_owned();
        let n = nodes.to_string();
        let mut args = vec!["up", &path, "--nodes", &n];
        if real_node {
            args.push("--real-node");
        }
        run_script(&k8s_script("cluster.sh"), &args).await?;
        Ok(Self { dir })
    }

    /// A variable of the control plane's `env` file (`EBB_K8S_...`).
    pub fn env_var(&self, name: &str) -> anyhow::Result<String> {
        let env = std::fs::read_to_string(self.dir.path().join("env"))
            .context("cannot read the control plane's env file")?;
        let prefix = format!("{name}=");
        env.lines()
            .find_map(|l| {
                l.trim_start_matches("export ")
                    .strip_prefix(prefix.as_str())
            })
            .map(|v| v.trim_matches(|c| c == '"' || c == '\'').to_string())
            .with_context(|| format!("the control plane's env file has no {name}"))
    }

    /// The real node's name, when the cluster has one (`cluster.sh up --real-node`).
    pub fn real_node(&self) -> Option<String> {
        self.env_var("EBB_K8S_REAL_NODE").ok()
    }

    /// Imports OCI image archives into the real node's containerd (namespace `k8s.io`), keeping
    /// their names (`cluster.sh import-images`).
    pub async fn import_images(&self, archives: &[PathBuf]) -> anyhow::Result<()> {
        let path = self.dir.path().to_string_lossy().into_owned();
        let mut args = vec!["import-images".to_string(), path];
        args.extend(archives.iter().map(|a| a.to_string_lossy().into_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_script(&k8s_script("cluster.sh"), &args).await?;
        Ok(())
    }

    /// `ctr` against the real node's containerd, namespace `k8s.io`; returns its output.
    pub async fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let address = self.env_var("EBB_K8S_CONTAINERD_ADDRESS")?;
        let out = tokio::process::Command::new("ctr")
            .args(["--address", &address, "--namespace", "k8s.io"])
            .args(args)
            .output()
            .await
            .context("cannot run ctr")?;
        if !out.status.success() {
            bail!(
                "ctr {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The directory holding `kubeconfig`, `audit.log` and the components' logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The kubectl built with this control plane.
    pub fn kubectl(&self) -> anyhow::Result<PathBuf> {
        self.env_var("EBB_K8S_KUBECTL").map(PathBuf::from)
    }

    /// Kills kube-apiserver (SIGKILL), waits `down`, starts it again with the same flags and
    /// returns once it is ready (`cluster.sh restart-apiserver`).
    pub async fn restart_apiserver(&self, down: Duration) -> anyhow::Result<()> {
        let path = self.dir.path().to_string_lossy().into_owned();
        let secs = down.as_secs().to_string();
        run_script(
            &k8s_script("cluster.sh"),
            &["restart-apiserver", &path, "--down-secs", &secs],
        )
        .await?;
        Ok(())
    }
}

impl RealCluster {
    /// Stops etcd (SIGKILL), waits `down`, starts it again with the same flags and data, and
    /// returns once kube-apiserver is ready again (`cluster.sh stop-etcd`).
    pub async fn stop_etcd(&self, down: Duration) -> anyhow::Result<()> {
        let path = self.dir.path().to_string_lossy().into_owned();
        let secs = down.as_secs().to_string();
        run_script(
            &k8s_script("cluster.sh"),
            &["stop-etcd", &path, "--down-secs", &secs],
        )
        .await?;
        Ok(())
    }

    /// Stops kube-controller-manager (`cluster.sh stop-controllers`): nothing reconciles
    /// ReplicaSets, collects garbage or publishes budgets until [`Self::start_controllers`].
    pub async fn stop_controllers(&self) -> anyhow::Result<()> {
        let path = self.dir.path().to_string_lossy().into_owned();
        run_script(&k8s_script("cluster.sh"), &["stop-controllers", &path]).await?;
        Ok(())
    }

    /// Stops kwok, every shard of it (`cluster.sh stop-kwok`): nodes keep their last status
    /// and no pod is started or ended until something else plays their kubelet.
    pub async fn stop_kwok(&self) -> anyhow::Result<()> {
        let path = self.dir.path().to_string_lossy().into_owned();
        run_script(&k8s_script("cluster.sh"), &["stop-kwok", &path]).await?;
        Ok(())
    }

    /// Starts kube-controller-manager again with its flags (`cluster.sh start-controllers`).
    pub async fn start_controllers(&self) -> anyhow::Result<()> {
        let path = self.dir.path().to_string_lossy().into_owned();
        run_script(&k8s_script("cluster.sh"), &["start-controllers", &path]).await?;
        Ok(())
    }

    /// Stops etcd (SIGTERM), copies its data directory to `to` and starts it again; returns
    /// once the API server is ready (`cluster.sh save-etcd`). A later control plane started
    /// with `EBB_K8S_ETCD_RESTORE=<to>` starts from that copy.
    pub async fn save_etcd(&self, to: &Path) -> anyhow::Result<()> {
        let path = self.dir.path().to_string_lossy().into_owned();
        let to = to.to_string_lossy().into_owned();
        run_script(&k8s_script("cluster.sh"), &["save-etcd", &path, &to]).await?;
        Ok(())
    }

    /// The audit log's evictions with their pods' uids.
    pub fn evictions(&self) -> anyhow::Result<Vec<crate::audit::EvictionRecord>> {
        let path = self.dir.path().join("audit.log");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read the audit log {}", path.display()))?;
        crate::audit::evictions(&text)
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for log in [
                "kube-apiserver.log",
                "kube-controller-manager.log",
                "kwok.log",
                "containerd.log",
                "kubelet.log",
                "kube-proxy.log",
            ] {
                let Ok(text) = std::fs::read_to_string(self.dir.path().join(log)) else {
                    continue;
                };
                let lines: Vec<&str> = text.lines().collect();
                let start = lines.len().saturating_sub(20);
                eprintln!("---- {log} (last {} lines) ----", lines.len() - start);
                for l in &lines[start..] {
                    eprintln!("{l}");
                }
            }
        }
        let _ = std::process::Command::new("bash")
            .arg(k8s_script("cluster.sh"))
            .arg("down")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The status code of `GET path` on 127.0.0.1:`port` (HTTP/1.0), `None` when it does not answer.
pub async fn http_status(port: u16, path: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut head = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), conn.read_to_end(&mut head))
        .await
        .ok()?
        .ok()?;
    let head = String::from_utf8_lossy(&head);
    head.split_whitespace().nth(1)?.parse().ok()
}

/// The last `n` lines of `file`.
pub fn tail(file: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Waits until `GET path` on 127.0.0.1:`port` answers 200, for a process started out of
/// cluster (`name`, writing to `log`); fails with the end of its log if it exits first or is
/// not ready within `timeout`.
pub async fn wait_http_ready(
    child: &mut tokio::process::Child,
    name: &str,
    log: &Path,
    port: u16,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "{name} exited ({status}) before it was ready; the end of {}:\n{}",
                log.display(),
                tail(log, 30)
            );
        }
        if http_status(port, path).await == Some(200) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "{name} not ready ({path} on port {port}) after {timeout:?}; the end of {}:\n{}",
                log.display(),
                tail(log, 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The flags that make a controller started as a host process serve the steering webhook on
/// a free port and register `https://127.0.0.1:<port>/steer` (there is no Service to call): for
/// `ebb-controller run` on the real backend, unless the arguments already say how to steer.
/// ebb-sim serves no admission webhooks: there the controller finds no configuration and says
/// that steering is off.
pub fn steering_args(backend: Backend, binary: &str, args: &[&str]) -> anyhow::Result<Vec<String>> {
    if backend != Backend::Real
        || binary != "ebb-controller"
        || args.first() != Some(&"run")
        || args.iter().any(|a| a.starts_with("--steering"))
    {
        return Ok(Vec::new());
    }
    let port = free_port()?;
    Ok(vec![
        "--steering-port".into(),
        port.to_string(),
        "--steering-webhook-url".into(),
        format!("https://127.0.0.1:{port}/steer"),
    ])
}

/// The first of `PATH`'s entries holding the program `name`.
pub fn which(name: &str) -> anyhow::Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} is not on PATH"))
}

/// A TCP port free on this host now.
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(l.local_addr().context("cannot find a free port")?.port())
}

#[cfg(test)]
mod patience_tests {
    use super::*;

    #[test]
    fn waits_stretch_with_the_load_per_cpu_between_one_and_four_times() {
        assert_eq!(load_factor(None, 2.0), 1.0);
        assert_eq!(load_factor(Some(0.5), 2.0), 1.0, "an idle machine");
        assert_eq!(load_factor(Some(5.0), 2.0), 2.5, "a build beside the suite");
        assert_eq!(load_factor(Some(40.0), 2.0), 4.0, "at most four times");
        assert!(scaled(Duration::from_secs(30)) >= Duration::from_secs(30));
        assert!(scaled(Duration::from_secs(30)) <= Duration::from_secs(30 * 4 * 1000));
    }
}
