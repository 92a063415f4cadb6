//! The disruption gate: an eviction is sent only when every PodDisruptionBudget over the pod
//! allows it now, counting evictions in flight and accepted ones the caches do not show yet.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::cluster::CachedPod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

use super::pods::PodRef;
use crate::cluster::build::selector_from;
use crate::cluster::types::Selector;
use crate::scaledown::pdb::allowance;

/// How long an accepted eviction counts against its budgets when the pod cache never shows the
/// pod terminating (the budget's own status has caught up long before).
const LEDGER_TTL: Duration = Duration::from_secs(120);

/// After a pod change, how long a drain held by a budget waits before it asks again (a budget's
/// own status change wakes it at once).
const RECHECK_AFTER_POD_CHANGE: Duration = Duration::from_millis(200);

/// What the gate says about one eviction.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Send it; `budgets` are the disruptions it takes (empty: it costs none).
    Send(Reservation),
    /// A budget (`namespace/name`) allows no more disruptions now: do not send, wait.
    Wait { pdb: String },
}

/// Disruptions held for one eviction being sent; hand it back with [`DisruptionGate::settle`].
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    uid: String,
    budgets: Vec<String>,
    /// The pod's cache key, to see it go without a pass over every pod.
    key: ObjectRef<CachedPod>,
}

#[derive(Default)]
struct Ledger {
    /// Evictions being sent, per budget.
    sending: HashMap<String, i64>,
    /// Accepted evictions by pod uid: their budgets, when, and the pod's cache key.
    accepted: HashMap<String, (Vec<String>, Instant, ObjectRef<CachedPod>)>,
    /// Evictions accepted under each budget since the process started: a drain waiting for a
    /// budget that keeps letting others through is not stuck.
    moved: HashMap<String, u64>,
}

/// Shared by every drain of the process. Cheap to clone.
#[derive(Clone)]
pub struct DisruptionGate {
    pods: Store<CachedPod>,
    /// Finds a budget's namespace's pods without a pass over every pod.
    index: crate::state::pod_index::PodIndex,
    pdbs: Option<Store<PodDisruptionBudget>>,
    changes: watch::Receiver<u64>,
    pdb_changes: Option<watch::Receiver<u64>>,
    ledger: Arc<Mutex<Ledger>>,
}

/// One budget as the gate reads it (its selector parsed once).
struct Budget<'a> {
    key: String,
    pdb: &'a PodDisruptionBudget,
    selector: Selector,
}

impl<'a> Budget<'a> {
    /// The budget, if it selects anything (a budget without a selector selects none).
    fn read(pdb: &'a PodDisruptionBudget) -> Option<Self> {
        let sel = pdb.spec.as_ref()?.selector.as_ref()?;
        Some(Budget {
            key: format!(
                "{}/{}",
                pdb.metadata.namespace.as_deref().unwrap_or_default(),
                pdb.metadata.name.as_deref().unwrap_or_default()
            ),
            pdb,
            selector: selector_from(sel, "PodDisruptionBudget", "").ok()?,
        })
    }

    /// Whether it selects `pod` (same namespace, labels match).
    fn selects(&self, pod: &CachedPod) -> bool {
        let empty = BTreeMap::new();
        self.pdb.metadata.namespace == pod.metadata.namespace
            && self
                .selector
                .matches(pod.metadata.labels.as_ref().unwrap_or(&empty))
    }
}

impl DisruptionGate {
    /// A gate over the pod cache; without budgets (see [`Self::with_budgets`]) it admits all.
    pub fn new(pods: Store<CachedPod>, pod_changes: watch::Receiver<u64>) -> Self {
        DisruptionGate {
            pods,
            index: Default::default(),
            pdbs: None,
            changes: pod_changes,
            pdb_changes: None,
            ledger: Arc::default(),
        }
    }

    /// Reads a namespace's pods from `index` (the pod watch's) instead of a pass over the cache.
    pub fn with_index(mut self, index: crate::state::pod_index::PodIndex) -> Self {
        self.index = index;
        self
    }

    /// Reads budgets from `pdbs`; `pdb_changes` ticks on every budget event.
    pub fn with_budgets(
        mut self,
        pdbs: Store<PodDisruptionBudget>,
        pdb_changes: watch::Receiver<u64>,
    ) -> Self {
        self.pdbs = Some(pdbs);
        self.pdb_changes = Some(pdb_changes);
        self
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether evicting `pod` now is within every budget over it; if so its disruptions are
    /// held until [`Self::settle`].
    pub fn admit(&self, pod: &PodRef) -> Admission {
        let key = ObjectRef::new(&pod.name).within(&pod.namespace);
        let free = || {
            Admission::Send(Reservation {
                uid: pod.uid.clone(),
                budgets: Vec::new(),
                key: key.clone(),
            })
        };
        let Some(pdbs) = &self.pdbs else {
            return free();
        };
        // One lookup, not a pass over every pod: the gate runs for every eviction and, while a
        // budget holds it, again on pod changes, and the cache holds every pod of the cluster.
        let Some(object) = self
            .pods
            .get(&key)
            .filter(|p| p.metadata.uid.as_deref() == Some(pod.uid.as_str()))
        else {
            return free(); // gone (or another pod of that name): the API server answers 404
        };
        if ignores_budgets(&object) {
            return free();
        }
        let budgets = pdbs.state();
        let over: Vec<Budget> = budgets
            .iter()
            .filter_map(|b| Budget::read(b))
            .filter(|b| b.selects(&object))
            .collect();
        if over.is_empty() {
            return free();
        }
        // Each budget's own pods (of its namespace only), kept by the pod watch: a namespace can
        // hold tens of thousands of pods, and a waiting eviction asks again on pod changes.
        let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
        let selected: Vec<Vec<Arc<CachedPod>>> = over
            .iter()
            .map(|b| {
                self.index
                    .selected(namespace, &b.key, &b.selector, &self.pods)
            })
            .collect();
        let mut ledger = self.lock();
        prune(&mut ledger, &self.pods);
        let evicted: HashSet<&str> = ledger.accepted.keys().map(String::as_str).collect();
        let mut costs = Vec::new();
        for (b, pods) in over.iter().zip(&selected) {
            match cost(b, &object, pods, &evicted, ledger.sending.get(&b.key)) {
                Some(true) => costs.push(b.key.clone()),
                Some(false) => {}
                None => return Admission::Wait { pdb: b.key.clone() },
            }
        }
        for k in &costs {
            *ledger.sending.entry(k.clone()).or_insert(0) += 1;
        }
        Admission::Send(Reservation {
            uid: pod.uid.clone(),
            budgets: costs,
            key,
        })
    }

    /// The eviction was answered: an accepted one keeps its disruptions until the caches show
    /// the pod going; any other answer gives them back.
    pub fn settle(&self, r: Reservation, accepted: bool) {
        let mut ledger = self.lock();
        for k in &r.budgets {
            if let Some(n) = ledger.sending.get_mut(k) {
                *n -= 1;
                if *n <= 0 {
                    ledger.sending.remove(k);
                }
            }
        }
        if accepted && !r.budgets.is_empty() {
            for k in &r.budgets {
                *ledger.moved.entry(k.clone()).or_insert(0) += 1;
            }
            ledger
                .accepted
                .insert(r.uid, (r.budgets, Instant::now(), r.key));
        }
    }

    /// How many of this process's evictions budget `pdb` (`namespace/name`) has let through:
    /// it grows while the budget moves.
    pub fn moved(&self, pdb: &str) -> u64 {
        self.lock().moved.get(pdb).copied().unwrap_or(0)
    }

    /// Waits until a pod or a budget changes, or `limit` passes.
    pub async fn changed(&self, limit: Duration) {
        let mut pods = self.changes.clone();
        pods.mark_unchanged();
        let mut pdbs = self.pdb_changes.clone();
        if let Some(p) = pdbs.as_mut() {
            p.mark_unchanged();
        }
        let budgets = async {
            match pdbs.as_mut() {
                Some(p) => {
                    let _ = p.changed().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = pods.changed() => {
                // Pods change hundreds of times a second in a big cluster, nearly always
                // elsewhere: look again at most this often rather than on every change.
                tokio::time::sleep(RECHECK_AFTER_POD_CHANGE.min(limit)).await;
            }
            _ = budgets => {}
            _ = tokio::time::sleep(limit) => {}
        }
    }
}

/// Pods the API server evicts without asking their budgets: terminating, not yet running, or
/// finished.
pub(crate) fn ignores_budgets(pod: &CachedPod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_some()
        || matches!(phase, Some("Pending" | "Succeeded" | "Failed"))
}

pub(crate) fn ready(pod: &CachedPod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Forgets accepted evictions the pod cache now shows (pod terminating or gone) or that are old.
fn prune(ledger: &mut Ledger, pods: &Store<CachedPod>) {
    ledger.accepted.retain(|uid, (_, at, key)| {
        at.elapsed() < LEDGER_TTL
            && pods.get(key).is_some_and(|p| {
                p.metadata.uid.as_deref() == Some(uid.as_str())
                    && p.metadata.deletion_timestamp.is_none()
            })
    });
}

/// What evicting `pod` costs budget `b`: `Some(true)` a disruption, `Some(false)` nothing
/// (an unready pod of a budget that is whole, or `unhealthyPodEvictionPolicy: AlwaysAllow`),
/// `None` the budget would refuse it now. As the API server decides, with the disruptions being
/// sent (`sending`) and accepted evictions the caches do not show yet (`evicted`) counted.
fn cost(
    b: &Budget,
    pod: &CachedPod,
    pods: &[Arc<CachedPod>],
    evicted: &HashSet<&str>,
    sending: Option<&i64>,
) -> Option<bool> {
    let generation = b.pdb.metadata.generation.unwrap_or(0);
    let status = b
        .pdb
        .status
        .as_ref()
        .filter(|s| s.observed_generation.is_some_and(|g| g >= generation))?;
    if !ready(pod) {
        let always = b
            .pdb
            .spec
            .as_ref()
            .and_then(|s| s.unhealthy_pod_eviction_policy.as_deref())
            == Some("AlwaysAllow");
        if always
            || (status.current_healthy >= status.desired_healthy && status.desired_healthy > 0)
        {
            return Some(false);
        }
    }
    let disrupted = status.disrupted_pods.as_ref();
    let healthy = pods
        .iter()
        .filter(|p| b.selects(p) && ready(p) && p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            !p.metadata
                .uid
                .as_deref()
                .is_some_and(|u| evicted.contains(u))
        })
        .filter(|p| {
            !disrupted.is_some_and(|d| d.contains_key(p.metadata.name.as_deref().unwrap_or("")))
        })
        .count() as i64;
    let left = allowance(
        i64::from(status.disruptions_allowed),
        i64::from(status.desired_healthy),
        healthy,
    ) - sending.copied().unwrap_or(0);
    (left >= 1).then_some(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{pdb_min_available, pod};
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;

    fn cache<K>(objs: Vec<K>) -> Store<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        let (reader, mut writer) = store::<K>();
        writer.apply_watcher_event(&Event::Init);
        for o in objs {
            writer.apply_watcher_event(&Event::InitApply(o));
        }
        writer.apply_watcher_event(&Event::InitDone);
        reader
    }

    fn budget(min: i32, allowed: i32, healthy: i32) -> PodDisruptionBudget {
        let mut b = pdb_min_available("web", "app", "web", min);
        b.status = Some(PodDisruptionBudgetStatus {
            observed_generation: Some(0),
            disruptions_allowed: allowed,
            desired_healthy: min,
            current_healthy: healthy,
            expected_pods: 3,
            ..Default::default()
        });
        b
    }

    fn web(name: &str) -> CachedPod {
        pod(name)
            .on("n")
            .label("app", "web")
            .owned_by_rs("web")
            .build()
    }

    fn gate(pods: Vec<CachedPod>, pdbs: Vec<PodDisruptionBudget>) -> DisruptionGate {
        let (_tx, rx) = watch::channel(0);
        DisruptionGate::new(cache(pods), rx.clone()).with_budgets(cache(pdbs), rx)
    }

    fn r(name: &str) -> PodRef {
        PodRef {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-default-{name}"),
            grace: None,
        }
    }

    fn sends(a: &Admission) -> bool {
        matches!(a, Admission::Send(_))
    }

    #[test]
    fn one_disruption_is_held_for_the_eviction_being_sent_then_for_the_accepted_one() {
        let g = gate(vec![web("a"), web("b"), web("c")], vec![budget(2, 1, 3)]);
        let Admission::Send(first) = g.admit(&r("a")) else {
            panic!("the budget allows one");
        };
        assert_eq!(
            g.admit(&r("b")),
            Admission::Wait {
                pdb: "default/web".into()
            },
            "held for a's eviction in flight"
        );
        assert_eq!(g.moved("default/web"), 0, "sent, not yet accepted");
        g.settle(first, true);
        // Accepted; the caches still show `a` running and the budget's status unchanged.
        assert!(!sends(&g.admit(&r("b"))));
        assert_eq!(g.moved("default/web"), 1, "the budget moved");
        assert_eq!(g.moved("default/other"), 0);
        // Refused instead: given back, and the budget did not move.
        let g = gate(vec![web("a"), web("b"), web("c")], vec![budget(2, 1, 3)]);
        let Admission::Send(first) = g.admit(&r("a")) else {
            panic!("the budget allows one");
        };
        g.settle(first, false);
        assert_eq!(g.moved("default/web"), 0);
        assert!(sends(&g.admit(&r("b"))));
    }

    #[test]
    fn a_stale_or_missing_status_means_wait() {
        let mut stale = budget(2, 1, 3);
        stale.metadata.generation = Some(2);
        let g = gate(vec![web("a"), web("b"), web("c")], vec![stale]);
        assert!(!sends(&g.admit(&r("a"))));
        let mut none = budget(2, 1, 3);
        none.status = None;
        let g = gate(vec![web("a"), web("b"), web("c")], vec![none]);
        assert!(!sends(&g.admit(&r("a"))));
    }

    #[test]
    fn unready_pods_are_free_only_while_the_budget_is_whole() {
        let unready = pod("u").on("n").label("app", "web").not_ready().build();
        // Whole (3 healthy of 2): evicting the unready pod costs nothing, even with 0 allowed.
        let g = gate(
            vec![web("a"), web("b"), web("c"), unready.clone()],
            vec![budget(2, 0, 3)],
        );
        assert_eq!(
            g.admit(&r("u")),
            Admission::Send(Reservation {
                uid: "uid-default-u".into(),
                budgets: vec![],
                key: ObjectRef::new("u").within("default"),
            })
        );
        // Not whole (1 healthy of 2) and nothing allowed: the API server would refuse.
        let g = gate(vec![web("a"), unready], vec![budget(2, 0, 1)]);
        assert!(!sends(&g.admit(&r("u"))));
    }

    #[test]
    fn pods_without_a_budget_and_terminating_pods_pass() {
        let g = gate(
            vec![pod("x").on("n").build(), web("t")],
            vec![budget(3, 0, 3)],
        );
        assert!(sends(&g.admit(&r("x"))));
        let g = gate(
            vec![pod("t").on("n").label("app", "web").terminating().build()],
            vec![budget(3, 0, 3)],
        );
        assert!(sends(&g.admit(&r("t"))));
    }

    #[test]
    fn a_pod_the_status_records_as_disrupted_is_not_healthy() {
        let mut b = budget(2, 1, 3);
        if let Some(s) = b.status.as_mut() {
            s.disrupted_pods = Some(BTreeMap::from([(
                "a".to_string(),
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
            )]));
        }
        // The status says 1 allowed, but a is already disrupted: b and c healthy, 2 must stay.
        let g = gate(vec![web("a"), web("b"), web("c")], vec![b]);
        assert!(!sends(&g.admit(&r("b"))));
    }
}
