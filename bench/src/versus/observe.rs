//! Watches every pod of a real cluster while a scaler runs: which disruptions broke a
//! PodDisruptionBudget and how long replacement pods stayed Pending, from the API's own events.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::watch;

/// A PodDisruptionBudget as the observer judges it: the pods it covers (matchLabels in one
/// namespace) and how many of them must stay healthy (the disruption controller's
/// `status.desiredHealthy` when the run started).
#[derive(Clone, Debug)]
pub struct Budget {
    pub namespace: String,
    pub name: String,
    pub match_labels: BTreeMap<String, String>,
    pub desired_healthy: i32,
}

impl Budget {
    fn covers(&self, p: &PodState) -> bool {
        p.namespace == self.namespace
            && self
                .match_labels
                .iter()
                .all(|(k, v)| p.labels.get(k) == Some(v))
    }
}

/// A disruption that left a budget below its desired healthy count.
#[derive(Clone, Debug)]
pub struct Violation {
    pub budget: String,
    pub pod: String,
    pub healthy_after: i32,
    pub desired_healthy: i32,
}

#[derive(Clone, Debug)]
struct PodState {
    namespace: String,
    name: String,
    labels: BTreeMap<String, String>,
    /// Ready and not being deleted: what the disruption controller counts as healthy.
    healthy: bool,
    deleting: bool,
    running: bool,
    /// The node it is bound to.
    node: Option<String>,
    /// Set for a pod created after the observer started, until it runs.
    pending_since: Option<Instant>,
    /// Created after the observer started (a replacement of a pod the scaler moved, mostly).
    born_in_run: bool,
    /// How long after it appeared a pod created during the run was bound to a node: the part
    /// of its Pending time spent waiting for the scheduler (the rest is its node starting it).
    bound_after: Option<Duration>,
}

impl PodState {
    /// The pod's name and where its Pending time went.
    fn pending_label(&self) -> String {
        match self.bound_after {
            Some(b) => format!(
                "{}/{} (bound to {} after {:.1} s)",
                self.namespace,
                self.name,
                self.node.as_deref().unwrap_or("?"),
                b.as_secs_f64()
            ),
            None => format!("{}/{} (never bound)", self.namespace, self.name),
        }
    }
}

fn state_of(p: &Pod) -> PodState {
    let status = p.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let deleting = p.metadata.deletion_timestamp.is_some();
    PodState {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        labels: p.metadata.labels.clone().unwrap_or_default(),
        healthy: ready && !deleting,
        deleting,
        running: status.and_then(|s| s.phase.as_deref()) == Some("Running"),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        pending_since: None,
        born_in_run: false,
        bound_after: None,
    }
}

/// How many of the replacements moved again the notes name.
const MOVED_AGAIN_NAMED: usize = 5;

#[derive(Default)]
struct Inner {
    pods: HashMap<String, PodState>,
    violations: Vec<Violation>,
    /// Longest Pending time of a pod that ran, and its name.
    longest_pending: Option<(Duration, String)>,
    /// Disruptions of pods created during the run.
    disrupted_again: usize,
    /// The first few of them: `namespace/name on node`.
    moved_again: Vec<String>,
    /// When a pod on each node was disrupted for the first time.
    first_disruption: HashMap<String, jiff::Timestamp>,
    initialized: bool,
}

impl Inner {
    fn healthy(&self, b: &Budget) -> i32 {
        let n = self
            .pods
            .values()
            .filter(|p| p.healthy && b.covers(p))
            .count();
        i32::try_from(n).unwrap_or(i32::MAX)
    }

    /// A healthy pod stopped being healthy because it is being deleted (an eviction, a direct
    /// delete, or the pod garbage collector after its Node went): check every budget covering it.
    fn disrupted(&mut self, budgets: &[Budget], pod: &PodState) {
        if pod.born_in_run {
            self.disrupted_again += 1;
            if self.moved_again.len() < MOVED_AGAIN_NAMED {
                self.moved_again.push(format!(
                    "{}/{} on {}",
                    pod.namespace,
                    pod.name,
                    pod.node.as_deref().unwrap_or("?")
                ));
            }
        }
        if let Some(node) = &pod.node {
            self.first_disruption
                .entry(node.clone())
                .or_insert_with(jiff::Timestamp::now);
        }
        for b in budgets.iter().filter(|b| b.covers(pod)) {
            let healthy_after = self.healthy(b);
            if healthy_after < b.desired_healthy {
                self.violations.push(Violation {
                    budget: format!("{}/{}", b.namespace, b.name),
                    pod: format!("{}/{}", pod.namespace, pod.name),
                    healthy_after,
                    desired_healthy: b.desired_healthy,
                });
            }
        }
    }

    fn apply(&mut self, budgets: &[Budget], pod: &Pod, live: bool) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let mut new = state_of(pod);
        let old = self.pods.get(&uid).cloned();
        match &old {
            Some(o) => {
                new.pending_since = o.pending_since;
                new.born_in_run = o.born_in_run;
                new.bound_after = o.bound_after;
            }
            None if live => {
                new.born_in_run = true;
                if !new.running {
                    new.pending_since = Some(Instant::now());
                }
            }
            None => {}
        }
        if new.bound_after.is_none()
            && new.node.is_some()
            && let Some(since) = new.pending_since
        {
            new.bound_after = Some(since.elapsed());
        }
        if new.running
            && let Some(since) = new.pending_since.take()
        {
            let d = since.elapsed();
            if self.longest_pending.as_ref().is_none_or(|(l, _)| d > *l) {
                self.longest_pending = Some((d, new.pending_label()));
            }
        }
        let was_healthy = old.as_ref().is_some_and(|o| o.healthy);
        let now_disrupted = was_healthy && !new.healthy && new.deleting;
        self.pods.insert(uid, new.clone());
        if live && now_disrupted {
            self.disrupted(budgets, &new);
        }
    }

    fn delete(&mut self, budgets: &[Budget], pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_ref() else {
            return;
        };
        if let Some(old) = self.pods.remove(uid)
            && old.healthy
        {
            // Removed in one step while still healthy (grace period 0, or a forced delete).
            self.disrupted(budgets, &old);
        }
    }
}

/// What the observer saw.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub violations: Vec<Violation>,
    /// The longest time a pod created during the run stayed Pending (pods still Pending at the
    /// end count up to now), and its name.
    pub longest_pending: Option<(Duration, String)>,
    /// Pods created during the run that are still not Running.
    pub still_pending: usize,
    /// Healthy pods created during the run (replacements, mostly) that were then disrupted
    /// themselves: pods the scaler moved twice or more.
    pub disrupted_again: usize,
    /// The first few of them, named: `namespace/name on node` (the node it was moved from again).
    pub moved_again: Vec<String>,
    /// For each node, when a pod on it was disrupted (evicted, deleted) for the first time.
    pub first_disruption: HashMap<String, jiff::Timestamp>,
}

/// A running pod watch; dropped or [`Observer::stop`]ped at the end of a run.
pub struct Observer {
    inner: Arc<Mutex<Inner>>,
    task: tokio::task::JoinHandle<()>,
}

impl Observer {
    /// Starts watching all pods; returns once the initial list is in (so every later change is
    /// judged against a complete picture).
    pub async fn start(client: kube::Client, budgets: Vec<Budget>) -> anyhow::Result<Self> {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let (ready_tx, mut ready_rx) = watch::channel(false);
        let state = inner.clone();
        let task = tokio::spawn(async move {
            let api: Api<Pod> = Api::all(client);
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Some(ev) = stream.next().await {
                let Ok(ev) = ev else { continue };
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                let live = s.initialized;
                match ev {
                    watcher::Event::Apply(p) => s.apply(&budgets, &p, true),
                    watcher::Event::Delete(p) => s.delete(&budgets, &p),
                    watcher::Event::InitApply(p) => s.apply(&budgets, &p, live),
                    watcher::Event::Init => {}
                    watcher::Event::InitDone => {
                        s.initialized = true;
                        let _ = ready_tx.send(true);
                    }
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(60), ready_rx.wait_for(|r| *r))
            .await
            .map_err(|_| {
                anyhow::anyhow!("the pod watch did not list the cluster's pods within 60s")
            })?
            .map_err(|_| {
                anyhow::anyhow!("the pod watch ended before listing the cluster's pods")
            })?;
        Ok(Self { inner, task })
    }

    /// Stops watching and returns what was seen.
    pub fn stop(self) -> Observed {
        self.task.abort();
        let s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut longest = s.longest_pending.clone();
        let mut still_pending = 0;
        for p in s.pods.values() {
            if let Some(since) = p.pending_since {
                still_pending += 1;
                let d = since.elapsed();
                if longest.as_ref().is_none_or(|(l, _)| d > *l) {
                    longest = Some((d, p.pending_label()));
                }
            }
        }
        Observed {
            violations: s.violations.clone(),
            longest_pending: longest,
            still_pending,
            disrupted_again: s.disrupted_again,
            moved_again: s.moved_again.clone(),
            first_disruption: s.first_disruption.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, ready: bool, deleting: bool) -> Pod {
        let mut v = json!({
            "metadata": {"name": uid, "namespace": "w", "uid": uid, "labels": {"app": "a"}},
            "status": {"phase": "Running",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-11-23T10:00:00Z");
        }
        serde_json::from_value(v).unwrap()
    }

    fn budget(desired: i32) -> Vec<Budget> {
        vec![Budget {
            namespace: "w".into(),
            name: "a".into(),
            match_labels: [("app".to_string(), "a".to_string())].into(),
            desired_healthy: desired,
        }]
    }

    #[test]
    fn a_disruption_below_the_desired_healthy_count_is_a_violation() {
        let b = budget(2);
        let mut s = Inner::default();
        for u in ["p1", "p2", "p3"] {
            s.apply(&b, &pod(u, true, false), false);
        }
        s.initialized = true;
        s.apply(&b, &pod("p1", true, true), true);
        assert!(
            s.violations.is_empty(),
            "2 of 3 healthy is allowed: {:?}",
            s.violations
        );
        s.apply(&b, &pod("p2", true, true), true);
        assert_eq!(s.violations.len(), 1, "1 healthy < 2 desired");
        assert_eq!(s.violations[0].healthy_after, 1);
        assert_eq!(s.disrupted_again, 0, "p1 and p2 were there before");
    }

    #[test]
    fn the_first_disruption_on_each_node_is_kept() {
        let b = budget(0);
        let mut s = Inner::default();
        let on = |uid: &str, node: &str, deleting: bool| {
            let mut p = pod(uid, true, deleting);
            p.spec =
                Some(serde_json::from_value(json!({"nodeName": node, "containers": []})).unwrap());
            p
        };
        s.apply(&b, &on("p1", "n1", false), false);
        s.apply(&b, &on("p2", "n1", false), false);
        s.initialized = true;
        s.apply(&b, &on("p1", "n1", true), true);
        let first = s.first_disruption["n1"];
        s.apply(&b, &on("p2", "n1", true), true);
        assert_eq!(s.first_disruption["n1"], first);
        assert_eq!(s.first_disruption.len(), 1);
    }

    #[test]
    fn a_replacement_disrupted_in_turn_is_counted() {
        let b = budget(0);
        let mut s = Inner::default();
        s.apply(&b, &pod("p1", true, false), false);
        s.initialized = true;
        s.apply(&b, &pod("p1", true, true), true);
        s.apply(&b, &pod("p2", false, false), true);
        s.apply(&b, &pod("p2", true, false), true);
        s.apply(&b, &pod("p2", true, true), true);
        assert_eq!(s.disrupted_again, 1);
        assert_eq!(s.moved_again, ["w/p2 on ?"]);
    }

    #[test]
    fn a_replacement_s_pending_time_is_split_at_its_binding() {
        let b = budget(0);
        let mut s = Inner {
            initialized: true,
            ..Inner::default()
        };
        let mut p = pod("r1", false, false);
        if let Some(st) = p.status.as_mut() {
            st.phase = Some("Pending".into());
        }
        s.apply(&b, &p, true);
        assert!(s.pods["r1"].bound_after.is_none());
        std::thread::sleep(Duration::from_millis(20));
        p.spec = Some(serde_json::from_value(json!({"nodeName": "n9", "containers": []})).unwrap());
        s.apply(&b, &p, true);
        let bound = s.pods["r1"].bound_after.expect("bound");
        assert!(bound >= Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(20));
        if let Some(st) = p.status.as_mut() {
            st.phase = Some("Running".into());
        }
        s.apply(&b, &p, true);
        let (d, label) = s.longest_pending.clone().expect("it ran");
        assert!(d >= bound + Duration::from_millis(20), "{d:?} {bound:?}");
        assert!(label.starts_with("w/r1 (bound to n9 after 0."), "{label}");
    }

    #[test]
    fn a_healthy_pod_removed_in_one_step_is_judged_too_and_an_unready_one_is_not() {
        let b = budget(2);
        let mut s = Inner::default();
        s.apply(&b, &pod("p1", true, false), false);
        s.apply(&b, &pod("p2", true, false), false);
        s.apply(&b, &pod("p3", false, false), false);
        s.initialized = true;
        s.delete(&b, &pod("p3", false, false));
        assert!(s.violations.is_empty(), "p3 was not healthy");
        s.delete(&b, &pod("p1", true, false));
        assert_eq!(s.violations.len(), 1);
    }
}
