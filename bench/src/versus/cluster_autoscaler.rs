//! Cluster Autoscaler with its kwok provider, run out of cluster against the bench's control
//! plane: the binary and the commit it was built from, its provider ConfigMap and flags, and
//! what its log says it did.
//!
//! The project does not build Cluster Autoscaler (the Go module proxy refuses its modules): the
//! bench runs a `cluster-autoscaler` binary built with its kwok provider from
//! `kubernetes-sigs/cluster-autoscaler` at [`EXPECTED_COMMIT`], found at `EBB_CA_BIN` or as
//! `cluster-autoscaler` in the control plane's bin dir ([`binary`]), and refuses one whose Go
//! build information names another commit ([`BinaryInfo::check`]).
//!
//! The provider groups the scenario's nodes into node groups by their [`SHAPE_LABEL`] (one group
//! on a uniform scenario, one per shape on a shaped one), knows GPU nodes by their
//! [`GPU_TYPE_LABEL`], and reads the templates from the live nodes (`readNodesFrom: cluster`); the
//! nodes carry what it needs (providerID `kwok:<name>`, the `kwok.x-k8s.io/node: fake`
//! annotation, the node-group name and min-count annotations; see
//! [`super::scenario::node_object`]). It is stopped with SIGKILL: on SIGTERM or SIGINT its signal
//! handler runs the kwok provider's cleanup, which deletes every node of its node groups.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::Settings;
use super::scenario::{GPU_TYPE, GPU_TYPE_LABEL, SHAPE_LABEL};
use ebb_e2e::harness::TestEnv;
use ebb_e2e::harness::wait_http_ready;

/// The commit of `kubernetes-sigs/cluster-autoscaler` the bench runs: the newest on Kubernetes
/// 1.36 libraries (2026-08-10).
pub const EXPECTED_COMMIT: &str = "5e64edda063ed73e7fc7861bc6fe77a6872d4195";
/// Where its source is.
pub const REPOSITORY: &str = "https://github.com/kubernetes-sigs/cluster-autoscaler";
/// The commit of `kubernetes/autoscaler` whose `cluster-autoscaler/apis` module it uses.
pub const APIS_COMMIT: &str = "eec9bc4dc1d26c3956ff941f786f7be52de68882";
/// The namespace of its kwok provider ConfigMap (`POD_NAMESPACE`) and its status ConfigMap
/// (`--namespace`, whose default it is).
pub const NAMESPACE: &str = "kube-system";
/// The kwok provider's ConfigMap (its default name).
pub const CONFIG_MAP: &str = "kwok-provider-config";
/// The taint it puts on a node it drains and deletes.
pub const DELETION_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
/// `--unremovable-node-recheck-timeout` at its default: a node found unremovable in its
/// simulation is not looked at again for this long, whatever changes meanwhile.
pub const UNREMOVABLE_RECHECK: Duration = Duration::from_secs(300);

/// The `cluster-autoscaler` binary the bench runs: `EBB_CA_BIN`, else `cluster-autoscaler` in the
/// control plane's bin dir. Fails, saying where it looked, when there is none.
pub fn binary() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("EBB_CA_BIN") {
        Some(p) => PathBuf::from(p),
        None => super::peers_bin_dir()?.join("cluster-autoscaler"),
    };
    if !path.is_file() {
        bail!(
            "no Cluster Autoscaler binary at {}: the bench runs one built with its kwok provider \
             from {REPOSITORY} at commit {EXPECTED_COMMIT} (with the cluster-autoscaler/apis \
             module of kubernetes/autoscaler at {APIS_COMMIT}); put it there or point EBB_CA_BIN \
             at it (see e2e/k8s/README.md, \"Cluster Autoscaler\")",
            path.display()
        );
    }
    Ok(path)
}

/// What a binary's Go build information says it was built from (`go version -m`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BinaryInfo {
    pub go: String,
    /// The main module's path (`sigs.k8s.io/cluster-autoscaler`).
    pub module: String,
    /// `vcs.revision`, when it was built in a git checkout.
    pub commit: Option<String>,
    /// `vcs.modified`: the checkout had changes (such as the `replace` of the apis module).
    pub modified: bool,
    /// `-tags`.
    pub tags: Vec<String>,
    /// The `k8s.io/kubernetes` version it was built against.
    pub kubernetes: Option<String>,
}

impl BinaryInfo {
    /// Parses the output of `go version -m BINARY`.
    pub fn parse(text: &str) -> Self {
        let mut info = BinaryInfo::default();
        for (i, line) in text.lines().enumerate() {
            if i == 0 {
                info.go = line
                    .rsplit(": ")
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_string();
                continue;
            }
            let f: Vec<&str> = line.split('\t').map(str::trim).collect();
            match f.as_slice() {
                [_, "mod", m, ..] => info.module = m.to_string(),
                [_, "dep", "k8s.io/kubernetes", v, ..] => info.kubernetes = Some(v.to_string()),
                [_, "build", kv] => match kv.split_once('=') {
                    Some(("-tags", t)) => {
                        info.tags = t.split(',').map(str::to_string).collect();
                    }
                    Some(("vcs.revision", r)) => info.commit = Some(r.to_string()),
                    Some(("vcs.modified", m)) => info.modified = m == "true",
                    _ => {}
                },
                _ => {}
            }
        }
        info
    }

    /// Why this binary is not the one the bench runs, if it is not: another module, no kwok
    /// provider, or another commit than [`EXPECTED_COMMIT`] (a binary without VCS information
    /// passes, and is reported as such by [`Self::describe`]).
    pub fn check(&self) -> Result<(), String> {
        if self.module != "sigs.k8s.io/cluster-autoscaler" {
            return Err(format!(
                "its main module is `{}`, not sigs.k8s.io/cluster-autoscaler",
                self.module
            ));
        }
        if !self.tags.iter().any(|t| t == "kwok") {
            return Err(format!(
                "it was built without the kwok provider (build tags {:?}; the kwok provider needs -tags kwok)",
                self.tags
            ));
        }
        match &self.commit {
            Some(c) if c != EXPECTED_COMMIT => Err(format!(
                "it was built from commit {c}, the bench expects {EXPECTED_COMMIT} of {REPOSITORY}"
            )),
            _ => Ok(()),
        }
    }

    /// `sigs.k8s.io/cluster-autoscaler 5e64edda063e (k8s.io/kubernetes v1.36.2, -tags kwok,
    /// go1.26.8)`.
    pub fn describe(&self) -> String {
        let commit = match &self.commit {
            Some(c) => format!(
                "commit {}{}",
                &c[..c.len().min(12)],
                if self.modified {
                    " with local changes (the apis module's replace)"
                } else {
                    ""
                }
            ),
            None => "commit unknown (built without VCS information)".to_string(),
        };
        format!(
            "{} {commit} (k8s.io/kubernetes {}, -tags {}, {})",
            self.module,
            self.kubernetes.as_deref().unwrap_or("?"),
            self.tags.join(","),
            self.go
        )
    }
}

/// Reads `path`'s Go build information with `go version -m`.
pub fn inspect(path: &Path) -> anyhow::Result<BinaryInfo> {
    let out = std::process::Command::new("go")
        .args(["version", "-m"])
        .arg(path)
        .output()
        .context(
            "cannot run `go version -m` (Go is needed to read the binary's build information)",
        )?;
    if !out.status.success() {
        bail!(
            "`go version -m {}` failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(BinaryInfo::parse(&String::from_utf8_lossy(&out.stdout)))
}

/// The binary and its build information, once checked; a reason the column cannot run otherwise.
pub fn checked_binary() -> Result<(PathBuf, BinaryInfo), String> {
    let path = binary().map_err(|e| format!("not built: {e:#}"))?;
    let info = inspect(&path).map_err(|e| format!("not run: {e:#}"))?;
    info.check().map_err(|why| {
        format!(
            "not run: {} is not the Cluster Autoscaler the bench runs: {why}",
            path.display()
        )
    })?;
    Ok((path, info))
}

/// The kwok provider's configuration: one node group per value of [`SHAPE_LABEL`], templates read
/// from the live nodes, GPU nodes known by [`GPU_TYPE_LABEL`] (`nodes.gpuConfig`: with it, a node
/// with GPUs is judged by its GPUs alone, against `--scale-down-gpu-utilization-threshold`),
/// everything else at the provider's defaults.
pub fn provider_config() -> String {
    format!(
        "apiVersion: v1alpha1\nreadNodesFrom: cluster\nnodegroups:\n  fromNodeLabelKey: \"{SHAPE_LABEL}\"\nnodes:\n  gpuConfig:\n    gpuLabelKey: \"{GPU_TYPE_LABEL}\"\n    availableGPUTypes:\n      \"{GPU_TYPE}\": {{}}\n"
    )
}

/// The flags of a run with `s`: the matched settings, `--scale-down-delay-after-add=0s` and
/// `--leader-elect=false`, what running out of cluster needs (`--kubeconfig`, the metrics and
/// health address on loopback) and the log verbosity; every other flag at its default.
pub fn flags(s: &Settings, kubeconfig: &Path, address: &str) -> Vec<String> {
    vec![
        "--cloud-provider=kwok".to_string(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--address={address}"),
        format!("--scan-interval={}", super::secs(s.scan_interval)),
        format!(
            "--scale-down-unneeded-time={}",
            super::secs(s.unneeded_time)
        ),
        format!(
            "--max-scale-down-parallelism={}",
            s.max_scale_down_parallelism
        ),
        format!("--max-drain-parallelism={}", s.max_drain_parallelism),
        format!(
            "--scale-down-utilization-threshold={}",
            s.utilization_threshold
        ),
        "--scale-down-delay-after-add=0s".to_string(),
        "--leader-elect=false".to_string(),
        format!("--v={LOG_VERBOSITY}"),
    ]
}

/// klog verbosity: 4 logs, for each node it keeps, why (`Node X unremovable: cpu requested ...`
/// at 4, `Node X is not suitable for removal: ...` at 2); it changes nothing else.
pub const LOG_VERBOSITY: u32 = 4;

/// `cluster-autoscaler` running against a control plane of the suite; SIGKILLed when dropped.
pub struct ClusterAutoscaler {
    child: tokio::process::Child,
    log: PathBuf,
}

impl ClusterAutoscaler {
    /// Creates the kwok provider's ConfigMap in [`NAMESPACE`] and starts `binary` against `env`
    /// (a control plane the suite started) as cluster-admin, with [`flags`]; its environment is
    /// only `KUBECONFIG`, `KWOK_PROVIDER_MODE=local`, `POD_NAMESPACE` and `TZ=UTC` (its log's
    /// times), so that no variable of the caller's changes its defaults. Its log goes to `log`.
    /// Returns once its `/health-check` answers 200.
    pub async fn start(
        env: &TestEnv,
        binary: &Path,
        s: &Settings,
        log: &Path,
    ) -> anyhow::Result<Self> {
        let real = env.real().context(
            "Cluster Autoscaler runs only on a control plane the suite starts; unset EBB_E2E_KUBECONFIG",
        )?;
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
            "data": {"config": provider_config()}
        }))?;
        Api::<ConfigMap>::namespaced(env.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &cm)
            .await
            .with_context(|| format!("cannot create ConfigMap {NAMESPACE}/{CONFIG_MAP}"))?;
        let port = ebb_e2e::harness::free_port()?;
        let kubeconfig = real.kubeconfig();
        let args = flags(s, &kubeconfig, &format!("127.0.0.1:{port}"));
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let out = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        let _ = std::fs::write(
            log.with_extension("cmd"),
            format!(
                "KUBECONFIG={} KWOK_PROVIDER_MODE=local POD_NAMESPACE={NAMESPACE} TZ=UTC {} {}\n",
                kubeconfig.display(),
                binary.display(),
                args.join(" ")
            ),
        );
        let child = tokio::process::Command::new(binary)
            .args(&args)
            .env_clear()
            .env("KUBECONFIG", &kubeconfig)
            .env("KWOK_PROVIDER_MODE", "local")
            .env("POD_NAMESPACE", NAMESPACE)
            .env("TZ", "UTC")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let mut ca = Self {
            child,
            log: log.to_path_buf(),
        };
        let log = ca.log.clone();
        wait_http_ready(
            &mut ca.child,
            "cluster-autoscaler",
            &log,
            port,
            "/health-check",
            Duration::from_secs(60),
        )
        .await?;
        Ok(ca)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL (never SIGTERM: its kwok provider would delete the node group's nodes), then waits
    /// for it to go.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.child
            .kill()
            .await
            .context("cannot kill cluster-autoscaler")
    }
}

// ---- its log --------------------------------------------------------------------------------

/// One klog line: `I1125 13:50:01.123456   12345 file.go:123] message`.
#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    pub level: char,
    pub time: jiff::Timestamp,
    pub message: String,
}

/// Parses a klog line written in UTC during `year`.
pub fn parse_line(line: &str, year: i16) -> Option<LogLine> {
    let mut chars = line.chars();
    let level = chars.next().filter(|c| "IWEF".contains(*c))?;
    let rest = chars.as_str();
    let (date, rest) = rest.split_once(' ')?;
    if date.len() != 4 {
        return None;
    }
    let month: i8 = date[..2].parse().ok()?;
    let day: i8 = date[2..].parse().ok()?;
    let (clock, rest) = rest.split_once(' ')?;
    let (hms, micros) = clock.split_once('.')?;
    let mut parts = hms.split(':');
    let h: i8 = parts.next()?.parse().ok()?;
    let m: i8 = parts.next()?.parse().ok()?;
    let sec: i8 = parts.next()?.parse().ok()?;
    let micros: i32 = micros.parse().ok()?;
    let message = rest.split_once("] ")?.1.to_string();
    let time = jiff::civil::date(year, month, day)
        .at(h, m, sec, micros.checked_mul(1000)?)
        .to_zoned(jiff::tz::TimeZone::UTC)
        .ok()?
        .timestamp();
    Some(LogLine {
        level,
        time,
        message,
    })
}

/// A node the log says it started to remove.
#[derive(Clone, Debug, PartialEq)]
pub struct Removal {
    pub node: String,
    pub time: jiff::Timestamp,
    /// `removing empty node` (no pods to move) rather than `removing node ... pods to reschedule`.
    pub empty: bool,
}

/// What Cluster Autoscaler's log says about a run.
#[derive(Clone, Debug, Default)]
pub struct LogReport {
    pub removals: Vec<Removal>,
    /// `Scale-down calculation: ignoring N nodes unremovable in the last 5m0s`: each N, in order.
    pub ignoring: Vec<(jiff::Timestamp, usize)>,
    /// `N nodes found to be unremovable in simulation, will re-check them at T`: each N.
    pub unremovable_in_simulation: Vec<(jiff::Timestamp, usize)>,
    /// Lines at level W, E or F.
    pub warnings: Vec<String>,
    /// For each node: the last line that said why it was not removed.
    pub last_reason: std::collections::HashMap<String, String>,
}

/// Why `message` says `node` is not removed, if it says so: the reason, without the node name.
fn kept_reason(message: &str) -> Option<(String, String)> {
    for (prefix, sep) in [
        ("Node ", " unremovable: "),
        ("Node ", " is not suitable for removal: "),
        ("Node ", " cannot be removed: "),
    ] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((node, why)) = rest.split_once(sep)
        {
            let what = sep.trim().trim_end_matches(':');
            return Some((node.to_string(), format!("{what}: {why}")));
        }
    }
    for prefix in ["Skipping ", "Skipped "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            let node = rest.split([' ', ',']).next().unwrap_or_default();
            if !node.is_empty() && !node.chars().all(|c| c.is_ascii_digit()) {
                return Some((node.to_string(), message.to_string()));
            }
        }
    }
    if let Some((node, d)) = message.split_once(" was unneeded for ") {
        return Some((node.to_string(), format!("unneeded for {d}")));
    }
    None
}

/// Reads Cluster Autoscaler's log (written in UTC during `year`).
pub fn read_log(text: &str, year: i16) -> LogReport {
    let mut r = LogReport::default();
    let number = |s: &str| s.split_whitespace().next().and_then(|n| n.parse().ok());
    for line in text.lines() {
        let Some(l) = parse_line(line, year) else {
            continue;
        };
        let m = l.message.as_str();
        if l.level != 'I' {
            r.warnings.push(format!("{}: {m}", l.level));
        }
        if let Some(rest) = m.strip_prefix("Scale-down: removing empty node ") {
            r.removals.push(Removal {
                node: rest.trim_matches('"').to_string(),
                time: l.time,
                empty: true,
            });
        } else if let Some(rest) = m.strip_prefix("Scale-down: removing node ") {
            let node = rest.split(',').next().unwrap_or_default().to_string();
            r.removals.push(Removal {
                node,
                time: l.time,
                empty: false,
            });
        } else if let Some(rest) = m.strip_prefix("Scale-down calculation: ignoring ") {
            if let Some(n) = number(rest) {
                r.ignoring.push((l.time, n));
            }
        } else if m.contains(" nodes found to be unremovable in simulation") {
            if let Some(n) = number(m) {
                r.unremovable_in_simulation.push((l.time, n));
            }
        } else if let Some((node, why)) = kept_reason(m) {
            r.last_reason.insert(node, why);
        }
    }
    r
}

/// `message` with the scenario's node names (`kwok-node-<i>`, `kwok:kwok-node-<i>`) as `<node>`.
fn node_names_out(message: &str) -> String {
    message
        .split(' ')
        .map(|w| {
            if w.contains("kwok-node-") {
                let end: String = w
                    .chars()
                    .rev()
                    .take_while(|c| !c.is_alphanumeric())
                    .collect();
                format!("<node>{}", end.chars().rev().collect::<String>())
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A reason with its numbers and pod names taken out, so that nodes kept for the same reason
/// group together.
fn reason_kind(why: &str) -> String {
    let words: Vec<String> = why
        .split(' ')
        .map(|w| {
            if w.contains('/') {
                "<pod>".to_string()
            } else if w.chars().any(|c| c.is_ascii_digit()) {
                w.chars()
                    .filter(|c| !c.is_ascii_digit() && *c != '.')
                    .collect::<String>()
                    .replace("()", "")
            } else {
                w.to_string()
            }
        })
        .collect();
    words.join(" ")
}

fn since(t: jiff::Timestamp, start: jiff::Timestamp) -> f64 {
    t.duration_since(start).as_secs_f64()
}

impl LogReport {
    /// The notes the bench prints for Cluster Autoscaler: its removals in batches (one batch per
    /// loop), the nodes it ignored as recently unremovable, and for each node it kept (`kept`,
    /// the scenario's nodes left at the end) the last reason its log gave, grouped.
    pub fn notes(&self, start: jiff::Timestamp, kept: &[String]) -> Vec<String> {
        let mut notes = Vec::new();
        // Removals a loop starts are logged within a second of each other.
        let mut batches: Vec<(jiff::Timestamp, usize, usize)> = Vec::new();
        for r in &self.removals {
            match batches.last_mut() {
                Some((t, n, e)) if since(r.time, *t) < 1.0 => {
                    *n += 1;
                    *e += usize::from(r.empty);
                }
                _ => batches.push((r.time, 1, usize::from(r.empty))),
            }
        }
        let empty = self.removals.iter().filter(|r| r.empty).count();
        notes.push(format!(
            "Cluster Autoscaler's log: {} removals started ({} of empty nodes, {} drains) in {} batches{}",
            self.removals.len(),
            empty,
            self.removals.len() - empty,
            batches.len(),
            if batches.is_empty() {
                String::new()
            } else {
                format!(
                    ", at {}",
                    batches
                        .iter()
                        .map(|(t, n, _)| format!("{:.0} s ({n})", since(*t, start)))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ));
        if let (Some(first), Some(max)) = (
            self.ignoring.first(),
            self.ignoring.iter().map(|(_, n)| *n).max(),
        ) {
            let last = self.ignoring.last().unwrap_or(first);
            notes.push(format!(
                "it logged \"ignoring N nodes unremovable in the last {}\" in {} loops, from {:.0} s to {:.0} s, N up to {max} (last {})",
                go_duration(UNREMOVABLE_RECHECK),
                self.ignoring.len(),
                since(first.0, start),
                since(last.0, start),
                last.1
            ));
        }
        if !self.unremovable_in_simulation.is_empty() {
            let total: usize = self.unremovable_in_simulation.iter().map(|(_, n)| n).sum();
            notes.push(format!(
                "\"N nodes found to be unremovable in simulation, will re-check them at +{}\" {} times ({} nodes in all; at {})",
                go_duration(UNREMOVABLE_RECHECK),
                self.unremovable_in_simulation.len(),
                total,
                self.unremovable_in_simulation
                    .iter()
                    .map(|(t, n)| format!("{:.0} s: {n}", since(*t, start)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let mut groups: std::collections::BTreeMap<String, (usize, String)> = Default::default();
        for node in kept {
            let (kind, example) = match self.last_reason.get(node) {
                Some(why) => (reason_kind(why), format!("{node}: {why}")),
                None => ("no reason in its log".to_string(), node.clone()),
            };
            let e = groups.entry(kind).or_insert((0, example));
            e.0 += 1;
        }
        if !groups.is_empty() {
            let mut by: Vec<_> = groups.into_iter().collect();
            by.sort_by_key(|(_, (n, _))| std::cmp::Reverse(*n));
            notes.push(format!(
                "the {} nodes it kept, by the last reason its log gave: {}",
                kept.len(),
                by.iter()
                    .map(|(kind, (n, example))| format!("{n} × {kind} (e.g. {example})"))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        if !self.warnings.is_empty() {
            let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
            for w in &self.warnings {
                *kinds.entry(reason_kind(&node_names_out(w))).or_default() += 1;
            }
            let mut by: Vec<_> = kinds.into_iter().collect();
            by.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
            notes.push(format!(
                "cluster-autoscaler logged {} warnings or errors: {}",
                self.warnings.len(),
                by.iter()
                    .take(5)
                    .map(|(k, n)| format!("{n} × {}", k.chars().take(200).collect::<String>()))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        notes
    }
}

/// `5m0s`, as Go prints a duration of whole minutes.
fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_information_names_the_commit_and_the_tags() {
        let text = "/x/cluster-autoscaler: go1.26.8\n\tpath\tsigs.k8s.io/cluster-autoscaler/pkg\n\tmod\tsigs.k8s.io/cluster-autoscaler\t(devel)\t\n\tdep\tk8s.io/kubernetes\tv1.36.2\th1:abc=\n\tbuild\t-tags=kwok\n\tbuild\tvcs=git\n\tbuild\tvcs.revision=5e64edda063ed73e7fc7861bc6fe77a6872d4195\n\tbuild\tvcs.modified=true\n";
        let info = BinaryInfo::parse(text);
        assert_eq!(info.go, "go1.26.8");
        assert_eq!(info.module, "sigs.k8s.io/cluster-autoscaler");
        assert_eq!(info.kubernetes.as_deref(), Some("v1.36.2"));
        assert_eq!(info.tags, vec!["kwok"]);
        assert!(info.modified);
        assert_eq!(info.check(), Ok(()));
        let other = BinaryInfo {
            commit: Some("0123456789abcdef".into()),
            ..info.clone()
        };
        let why = other.check().unwrap_err();
        assert!(
            why.contains("0123456789abcdef") && why.contains(EXPECTED_COMMIT),
            "{why}"
        );
        let untagged = BinaryInfo {
            tags: vec![],
            ..info
        };
        assert!(untagged.check().unwrap_err().contains("kwok"));
    }

    #[test]
    fn klog_lines_are_read_in_utc() {
        let l = parse_line(
            "I1125 13:50:01.250000   12345 actuator.go:269] Scale-down: removing node kwok-node-3, utilization: {0.06 0.01 0 cpu 0.06}, pods to reschedule: work/paced-1",
            2026,
        )
        .unwrap();
        assert_eq!(l.level, 'I');
        assert_eq!(l.time.to_string(), "2026-11-25T13:50:01.25Z");
        assert!(
            l.message
                .starts_with("Scale-down: removing node kwok-node-3,")
        );
        assert!(parse_line("not a klog line", 2026).is_none());
    }

    #[test]
    fn the_log_gives_removals_and_the_reasons_nodes_were_kept() {
        let log = [
            "I1125 13:50:00.000000 1 eligibility.go:162] Node kwok-node-0 unremovable: cpu requested (65.625% of allocatable) is above the scale-down utilization threshold",
            "I1125 13:50:00.100000 1 eligibility.go:162] Node kwok-node-1 unremovable: cpu requested (70% of allocatable) is above the scale-down utilization threshold",
            "I1125 13:50:00.200000 1 cluster.go:209] Node kwok-node-2 is not suitable for removal: cannot move pod work/paced-abc: not enough pod disruption budget to move work/paced-abc",
            "I1125 13:50:00.300000 1 planner.go:336] 1 nodes found to be unremovable in simulation, will re-check them at 2026-11-25 13:55:00",
            "I1125 13:50:10.000000 1 actuator.go:176] Scale-down: removing empty node \"kwok-node-5\"",
            "I1125 13:50:10.200000 1 actuator.go:269] Scale-down: removing node kwok-node-4, utilization: {0.06}, pods to reschedule: work/paced-1",
            "I1125 13:50:20.000000 1 eligibility.go:103] Scale-down calculation: ignoring 1 nodes unremovable in the last 5m0s",
            "W1125 13:50:21.000000 1 x.go:1] something odd",
        ]
        .join("\n");
        let r = read_log(&log, 2026);
        assert_eq!(r.removals.len(), 2);
        assert!(r.removals[0].empty && r.removals[0].node == "kwok-node-5");
        assert!(!r.removals[1].empty && r.removals[1].node == "kwok-node-4");
        assert_eq!(r.ignoring.len(), 1);
        assert_eq!(r.unremovable_in_simulation.len(), 1);
        assert_eq!(r.warnings.len(), 1);
        assert_eq!(
            node_names_out("No node group for node kwok:kwok-node-5, skipping"),
            "No node group for node <node>, skipping"
        );
        let start: jiff::Timestamp = "2026-11-25T13:49:50Z".parse().unwrap();
        let kept: Vec<String> = ["kwok-node-0", "kwok-node-1", "kwok-node-2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let notes = r.notes(start, &kept);
        assert!(
            notes[0].contains(
                "2 removals started (1 of empty nodes, 1 drains) in 1 batches, at 20 s (2)"
            ),
            "{notes:?}"
        );
        let kept_note = notes.iter().find(|n| n.starts_with("the 3 nodes")).unwrap();
        assert!(
            kept_note.contains(
                "2 × unremovable: cpu requested (% of allocatable) is above the scale-down utilization threshold"
            ),
            "{kept_note}"
        );
        assert!(
            kept_note.contains("1 × is not suitable for removal: cannot move pod <pod> not enough pod disruption budget to move <pod>"),
            "{kept_note}"
        );
    }
}
