//! The simulated cluster: scheduler, kubelet, workload controllers, PDB status and pod GC, run
//! as one tokio task that reconciles on every store change and on sim-clock deadlines.

pub mod kubelet;
pub mod pdb;
pub mod scheduler;
pub mod workloads;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::api::Api;

/// Annotations tests use to script pods and nodes.
pub mod annotations {
    /// Sim time from binding to Running/Ready (default `1s`).
    pub const START_DELAY: &str = "sim.ebb.dev/start-delay";
    /// The container exits after running this long.
    pub const EXIT_AFTER: &str = "sim.ebb.dev/exit-after";
    /// Exit code for `exit-after` (default 0).
    pub const EXIT_CODE: &str = "sim.ebb.dev/exit-code";
    /// The container is OOMKilled (exit 137) after running this long.
    pub const OOM_AFTER: &str = "sim.ebb.dev/oom-after";
    /// `"true"`: the container never starts (CrashLoopBackOff, not ready).
    pub const FAIL_START: &str = "sim.ebb.dev/fail-start";
    /// On a node, `"true"`: its kubelet stops reporting (NotReady, unreachable taints).
    pub const NODE_DOWN: &str = "sim.ebb.dev/down";
}

/// One reconcile pass's view of the world.
pub struct World {
    pub now: Timestamp,
    pub nodes: Vec<Arc<Value>>,
    pub pods: Vec<Arc<Value>>,
    /// controller owner uid → its pods
    pub pods_by_owner: HashMap<String, Vec<Arc<Value>>>,
}

pub fn uid(v: &Value) -> &str {
    v.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn name(v: &Value) -> &str {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn namespace(v: &Value) -> &str {
    v.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn terminating(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp").is_some()
}

pub fn phase(v: &Value) -> &str {
    v.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending")
}

/// Counts toward a controller's replicas: not terminating and not finished.
pub fn active(p: &Value) -> bool {
    !terminating(p) && !matches!(phase(p), "Succeeded" | "Failed")
}

pub fn controller_uid(p: &Value) -> Option<&str> {
    p.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|o| o.get("controller").and_then(Value::as_bool) == Some(true))
        .and_then(|o| o.get("uid").and_then(Value::as_str))
}

impl World {
    fn load(api: &Api) -> Self {
        let pods = api.snapshot("", "pods");
        let mut pods_by_owner: HashMap<String, Vec<Arc<Value>>> = HashMap::new();
        for p in &pods {
            if let Some(u) = controller_uid(p) {
                pods_by_owner
                    .entry(u.to_string())
                    .or_default()
                    .push(p.clone());
            }
        }
        Self {
            now: api.clock.now(),
            nodes: api.snapshot("", "nodes"),
            pods,
            pods_by_owner,
        }
    }
}

/// The next sim-time deadline a component wants to be woken at.
#[derive(Default)]
pub struct Wake(Option<Timestamp>);

impl Wake {
    pub fn at(&mut self, t: Timestamp) {
        if self.0.is_none_or(|c| t < c) {
            self.0 = Some(t);
        }
    }
}

/// Runs one reconcile pass of every component.
pub fn reconcile(api: &Api) -> Wake {
    let mut wake = Wake::default();
    let mut steps: Vec<(&'static str, u128)> = Vec::new();
    let mut t = std::time::Instant::now();
    let mut lap = |name: &'static str, t: &mut std::time::Instant| {
        steps.push((name, t.elapsed().as_millis()));
        *t = std::time::Instant::now();
    };
    let w = World::load(api);
    kubelet::nodes(api, &w);
    lap("nodes", &mut t);
    let w = World::load(api);
    workloads::deployments(api, &w);
    workloads::replicasets(api, &w);
    workloads::statefulsets(api, &w, &mut wake);
    workloads::daemonsets(api, &w);
    workloads::jobs(api, &w);
    lap("workloads", &mut t);
    let w = World::load(api);
    kubelet::schedule(api, &w);
    lap("scheduler", &mut t);
    let w = World::load(api);
    kubelet::pods(api, &w, &mut wake);
    lap("kubelet", &mut t);
    let w = World::load(api);
    pdb::statuses(api, &w);
    lap("pdb", &mut t);
    let total: u128 = steps.iter().map(|s| s.1).sum();
    if total > 500 {
        tracing::info!(steps = ?steps, "simulated cluster pass: time per component (ms)");
    }
    wake
}

/// Starts the cluster loop.
pub fn spawn(api: Arc<Api>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let notified = api.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let started = std::time::Instant::now();
            let a = api.clone();
            let Ok(wake) = tokio::task::spawn_blocking(move || reconcile(&a)).await else {
                tracing::error!("simulated cluster pass panicked; stopping the simulated cluster");
                return;
            };
            let took = started.elapsed();
            if took > Duration::from_millis(500) {
                tracing::info!(took_ms = took.as_millis() as u64, counts = ?api.counts(), "simulated cluster pass");
            }
            let until = wake
                .0
                .map(|t| {
                    let d = t.duration_since(api.clock.now());
                    let d = Duration::from_secs_f64(d.as_secs_f64().max(0.0));
                    api.clock.real_for(d)
                })
                .unwrap_or(Duration::from_secs(1))
                .clamp(Duration::from_millis(5), Duration::from_secs(1));
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(until) => {}
            }
            // Let a burst of writes settle before the next pass.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}
