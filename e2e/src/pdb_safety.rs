//! PodDisruptionBudget safety judged from the API server's records: no pod a budget covers is
//! evicted or deleted by the given users while that budget allows no disruption.
//!
//! On the real backend the audit log holds what is needed (see `e2e/k8s/cluster.sh`'s policy):
//! every PodDisruptionBudget write with its response (the disruption controller's
//! `disruptionsAllowed`), every pod write with its response (labels, Ready, deletion), and the
//! evictions with their answers. The check replays it in order: a budget allows what the
//! disruption controller last published, less the disruptions the Eviction API took since (its
//! own status write, which adds the pod to `disruptedPods`, is the moment an eviction is
//! accepted; its answer comes later). A disruption taken, or a DELETE of a Ready, not
//! terminating pod, while that is 0 or less is a violation. Budget status written by anyone
//! else is not believed. Concurrent requests reach the log in the order they finished, not
//! the order etcd stored them: a budget's writes are ordered by their `resourceVersion`.
//! On ebb-sim the server records deletes that violate a budget itself, and its Eviction API
//! refuses evictions a budget does not allow.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::harness::TestEnv;

/// The user kube-controller-manager's disruption controller writes budget status as
/// (`--use-service-account-credentials`).
pub const DISRUPTION_CONTROLLER: &str = "system:serviceaccount:kube-system:disruption-controller";

/// The user of kube-apiserver's own requests: the Eviction API's write of a budget's status
/// (one disruption fewer, the pod added to `disruptedPods`).
pub const APISERVER: &str = "system:apiserver";

/// A pod that left while a budget covering it allowed no disruption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub time: String,
    pub user: String,
    /// `namespace/name`.
    pub pod: String,
    /// `namespace/name`.
    pub pdb: String,
    /// `evicted` or `deleted`.
    pub how: &'static str,
    /// What the budget allowed then.
    pub allowed: i64,
    /// The budget's last changes before it, as replayed (for the failure message).
    pub history: Vec<String>,
}

#[derive(Default)]
struct Budget {
    selector: Value,
    /// The disruption controller's writes as (order, disruptionsAllowed).
    published: Vec<(u64, i64)>,
    /// The order of each disruption taken (the Eviction API's writes, evictions judged at
    /// their answer).
    takes: Vec<u64>,
    /// `status.disruptedPods` of each write, by its place in etcd's order: the log's order is
    /// not etcd's when two writes land together (the disruption controller's recount can be
    /// logged before the Eviction API's write it follows).
    disrupted: Vec<(u64, BTreeSet<String>)>,
    history: Vec<String>,
}

impl Budget {
    /// What the budget allowed just before `order`: the disruption controller's last write
    /// before it, less the disruptions taken between the two.
    fn allowed_before(&self, order: u64) -> i64 {
        let (at, allowed) = self
            .published
            .iter()
            .filter(|(o, _)| *o < order)
            .max_by_key(|(o, _)| *o)
            .copied()
            .unwrap_or((0, 0));
        let taken = self
            .takes
            .iter()
            .filter(|t| **t > at && **t < order)
            .count();
        allowed - taken as i64
    }

    /// What it allows now, after every write replayed so far.
    /// `status.disruptedPods` as written just before `order`.
    fn disrupted_before(&self, order: u64) -> BTreeSet<String> {
        self.disrupted
            .iter()
            .filter(|(o, _)| *o < order)
            .max_by_key(|(o, _)| *o)
            .map(|(_, d)| d.clone())
            .unwrap_or_default()
    }

    fn allowed(&self) -> i64 {
        self.allowed_before(u64::MAX)
    }

    fn note(&mut self, e: &Value, what: String) {
        if self.history.len() >= 12 {
            self.history.remove(0);
        }
        self.history
            .push(format!("{} {what}", s(e, "/stageTimestamp")));
    }
}

#[derive(Default)]
struct PodState {
    labels: BTreeMap<String, String>,
    ready: bool,
    terminating: bool,
}

fn pod_state(pod: &Value) -> PodState {
    PodState {
        labels: labels_of(pod),
        ready: ready_of(pod),
        terminating: pod.pointer("/metadata/deletionTimestamp").is_some(),
    }
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn ready_of(obj: &Value) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| s(c, "/type") == "Ready" && s(c, "/status") == "True")
        })
}

/// A label selector (`matchLabels`, `matchExpressions` with In, NotIn, Exists, DoesNotExist)
/// applied to `labels`; an empty or missing selector selects nothing, as for budgets.
pub fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let ml = selector.get("matchLabels").and_then(Value::as_object);
    let me = selector.get("matchExpressions").and_then(Value::as_array);
    if ml.is_none_or(|m| m.is_empty()) && me.is_none_or(|e| e.is_empty()) {
        return false;
    }
    let labels_ok = ml
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == Some(v.as_str().unwrap_or("\u{0}")));
    let exprs_ok = me.into_iter().flatten().all(|e| {
        let k = s(e, "/key");
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let got = labels.get(k).map(String::as_str);
        match s(e, "/operator") {
            "In" => got.is_some_and(|g| values.contains(&g)),
            "NotIn" => got.is_none_or(|g| !values.contains(&g)),
            "Exists" => got.is_some(),
            "DoesNotExist" => got.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// Replays a real kube-apiserver audit log (JSON lines) and returns the violations by `users`.
pub fn check_audit_text(text: &str, users: &[&str]) -> anyhow::Result<Vec<Violation>> {
    check_audit_text_from(text, users, &[], &[])
}

/// [`check_audit_text`] for a log that starts after the budgets were published and the pods
/// made: `budgets_before` and `pods_before` (as the API server returns them) are how each stood
/// before the log's first record. A control plane started from a saved etcd has budgets the
/// disruption controller may not write again (its status is unchanged), so the log alone
/// would show them allowing nothing; pods written straight to etcd have no record in it.
pub fn check_audit_text_from(
    text: &str,
    users: &[&str],
    budgets_before: &[Value],
    pods_before: &[Value],
) -> anyhow::Result<Vec<Violation>> {
    let mut budgets: BTreeMap<String, Budget> = BTreeMap::new();
    for b in budgets_before {
        let key = format!("{}/{}", s(b, "/metadata/namespace"), s(b, "/metadata/name"));
        let allowed = b
            .pointer("/status/disruptionsAllowed")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let mut seeded = Budget {
            selector: b.pointer("/spec/selector").cloned().unwrap_or(Value::Null),
            published: vec![(0, allowed)],
            takes: Vec::new(),
            disrupted: vec![(
                0,
                b.pointer("/status/disruptedPods")
                    .and_then(Value::as_object)
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default(),
            )],
            history: Vec::new(),
        };
        seeded.history.push(format!(
            "before the log: allowed {allowed}, healthy {:?}",
            b.pointer("/status/currentHealthy")
        ));
        budgets.insert(key, seeded);
    }
    let mut pods: HashMap<String, PodState> = pods_before
        .iter()
        .map(|p| {
            let key = format!("{}/{}", s(p, "/metadata/namespace"), s(p, "/metadata/name"));
            (key, pod_state(p))
        })
        .collect();
    let pod_bodies_before = pods.len();
    let mut out = Vec::new();
    // Pod → the budgets the Eviction API took a disruption from for it, each with the take's
    // place in etcd's order (judged when the eviction's answer names the user: by then the
    // writes logged out of order are in).
    type Taken = Vec<(String, u64)>;
    let mut taken: HashMap<String, Taken> = HashMap::new();
    let (mut accepted_evictions, mut pod_bodies) = (0usize, 0usize);
    // A budget write's place in etcd's order (its resourceVersion); a record without one is
    // taken to come after everything before it in the log.
    let mut latest = 0u64;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: Value = serde_json::from_str(line)
            .with_context(|| format!("audit log line {} is not JSON", i + 1))?;
        if s(&e, "/stage") != "ResponseComplete" {
            continue;
        }
        let code = e
            .pointer("/responseStatus/code")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if !(200..300).contains(&code) {
            continue;
        }
        let user = match s(&e, "/impersonatedUser/username") {
            "" => s(&e, "/user/username"),
            u => u,
        };
        let (verb, group, resource, sub) = (
            s(&e, "/verb"),
            s(&e, "/objectRef/apiGroup"),
            s(&e, "/objectRef/resource"),
            s(&e, "/objectRef/subresource"),
        );
        let key = format!(
            "{}/{}",
            s(&e, "/objectRef/namespace"),
            s(&e, "/objectRef/name")
        );
        let resp = e.get("responseObject").unwrap_or(&Value::Null);
        match (group, resource, sub, verb) {
            ("policy", "poddisruptionbudgets", _, "delete") => {
                budgets.remove(&key);
            }
            ("policy", "poddisruptionbudgets", sub, _) => {
                let b = budgets.entry(key.clone()).or_default();
                if let Some(sel) = resp.pointer("/spec/selector") {
                    b.selector = sel.clone();
                }
                if sub != "status" {
                    continue;
                }
                let disrupted: BTreeSet<String> = resp
                    .pointer("/status/disruptedPods")
                    .and_then(Value::as_object)
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default();
                let order = order_of(&mut latest, resp);
                if user == DISRUPTION_CONTROLLER {
                    let published = resp
                        .pointer("/status/disruptionsAllowed")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    b.published.push((order, published));
                    let allowed = b.allowed();
                    let healthy = resp.pointer("/status/currentHealthy").cloned();
                    b.note(
                        &e,
                        format!("disruption controller: allowed {allowed}, healthy {healthy:?}"),
                    );
                } else if user == APISERVER {
                    // The Eviction API took a disruption for each pod it added to
                    // disruptedPods: that write, not the eviction's answer, is the moment.
                    // Logged after a recount that already saw it, it is judged by what the
                    // budget allowed at its own place in etcd's order.
                    let ns = key.split('/').next().unwrap_or("");
                    let before = b.disrupted_before(order);
                    let new: Vec<String> = disrupted.difference(&before).cloned().collect();
                    for p in new {
                        let pod = format!("{ns}/{p}");
                        let takes = taken.entry(pod.clone()).or_default();
                        // Two of the Eviction API's writes logged the other way round: the
                        // later one, replayed first, already counted this pod (its set holds
                        // every pod the earlier one added). One eviction takes one disruption.
                        if takes.iter().any(|(pdb, o)| *pdb == key && *o > order) {
                            continue;
                        }
                        takes.push((key.clone(), order));
                        b.takes.push(order);
                        let allowed = b.allowed();
                        b.note(
                            &e,
                            format!("Eviction API took one for {pod}: allowed {allowed}"),
                        );
                    }
                } else {
                    let allowed = resp.pointer("/status/disruptionsAllowed").cloned();
                    b.note(
                        &e,
                        format!("status by {user} (not believed): allowed {allowed:?}"),
                    );
                }
                b.disrupted.push((order, disrupted));
            }
            ("", "pods", "eviction", "create") => {
                accepted_evictions += 1;
                let pod = pods.entry(key.clone()).or_default();
                let healthy = pod.ready && !pod.terminating;
                pod.terminating = true;
                if let Some(took) = taken.remove(&key) {
                    for (pdb, order) in took {
                        let Some(b) = budgets.get(&pdb) else { continue };
                        let allowed = b.allowed_before(order);
                        if allowed <= 0 && users.contains(&user) {
                            out.push(Violation {
                                time: s(&e, "/stageTimestamp").to_string(),
                                user: user.to_string(),
                                pod: key.clone(),
                                pdb,
                                how: "evicted",
                                allowed,
                                history: b.history.clone(),
                            });
                        }
                    }
                    continue;
                }
                if !healthy {
                    continue; // an unhealthy pod's eviction takes nothing from a budget
                }
                // No write of the Eviction API's seen: judge at the answer.
                for (name, b) in budgets.iter_mut() {
                    if !same_namespace(name, &key) || !selects(&b.selector, &pod.labels) {
                        continue;
                    }
                    if b.allowed() <= 0 && users.contains(&user) {
                        out.push(violation(&e, user, &key, name, "evicted", b));
                    }
                    latest += 1;
                    b.takes.push(latest);
                    let allowed = b.allowed();
                    b.note(&e, format!("{key} evicted by {user}: allowed {allowed}"));
                }
            }
            ("", "pods", "", "delete") => {
                let pod = pods.entry(key.clone()).or_default();
                let healthy = pod.ready && !pod.terminating;
                pod.terminating = true;
                if !healthy || !users.contains(&user) {
                    continue;
                }
                for (name, b) in &budgets {
                    if same_namespace(name, &key)
                        && selects(&b.selector, &pod.labels)
                        && b.allowed() <= 0
                    {
                        out.push(violation(&e, user, &key, name, "deleted", b));
                    }
                }
            }
            ("", "pods", "" | "status", _) if resp.is_object() => {
                pod_bodies += 1;
                pods.insert(key, pod_state(resp));
            }
            _ => {}
        }
    }
    if accepted_evictions > 0 && pod_bodies + pod_bodies_before == 0 {
        bail!(
            "the audit log has {accepted_evictions} accepted evictions but no pod bodies: its \
             policy must record pod writes at RequestResponse level (e2e/k8s/cluster.sh)"
        );
    }
    Ok(out)
}

/// A budget write's place in etcd's order: its resourceVersion; a record without one comes
/// after everything replayed before it.
fn order_of(latest: &mut u64, resp: &Value) -> u64 {
    let rv = resp
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|v| v.parse::<u64>().ok());
    match rv {
        Some(rv) => {
            *latest = (*latest).max(rv);
            rv
        }
        None => {
            *latest += 1;
            *latest
        }
    }
}

fn same_namespace(a: &str, b: &str) -> bool {
    a.split('/').next() == b.split('/').next()
}

fn violation(
    e: &Value,
    user: &str,
    pod: &str,
    pdb: &str,
    how: &'static str,
    b: &Budget,
) -> Violation {
    Violation {
        time: s(e, "/stageTimestamp").to_string(),
        user: user.to_string(),
        pod: pod.to_string(),
        pdb: pdb.to_string(),
        how,
        allowed: b.allowed(),
        history: b.history.clone(),
    }
}

/// The violations by `users` so far: on ebb-sim its own records (deletes; its Eviction API
/// enforces budgets), on a real cluster the replayed audit log.
pub fn violations(env: &TestEnv, users: &[&str]) -> anyhow::Result<Vec<Violation>> {
    if let Some(sim) = env.sim() {
        return Ok(sim
            .pdb_violations()
            .into_iter()
            .filter(|v| users.contains(&v.user.as_str()))
            .map(|v| Violation {
                time: v.time,
                user: v.user,
                pod: format!("{}/{}", v.namespace, v.pod),
                pdb: format!("{}/{}", v.namespace, v.pdb),
                how: "deleted",
                allowed: 0,
                history: Vec::new(),
            })
            .collect());
    }
    let real = env.real().context(
        "the PodDisruptionBudget check reads the audit log of a control plane the suite starts",
    )?;
    let path = real.dir().join("audit.log");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the audit log {}", path.display()))?;
    check_audit_text(&text, users)
}

/// Fails the test, listing them, when `users` violated a budget.
pub fn assert_safe(env: &TestEnv, users: &[&str]) {
    match violations(env, users) {
        Ok(v) if v.is_empty() => {}
        Ok(v) => {
            // Keep the evidence: the cluster's directory goes with the test.
            let kept = env.real().and_then(|r| {
                let to = std::env::temp_dir().join(format!(
                    "ebb-e2e-audit-{}-{}.log",
                    std::process::id(),
                    jiff::Timestamp::now().as_millisecond()
                ));
                std::fs::copy(r.dir().join("audit.log"), &to)
                    .ok()
                    .map(|_| to)
            });
            panic!(
                "PodDisruptionBudget violations ({}; audit log kept at {kept:?}): {v:#?}",
                v.len()
            )
        }
        Err(e) => panic!("the PodDisruptionBudget check could not run: {e:#}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CTL: &str = "system:serviceaccount:ebb-system:ebb-controller";

    #[allow(clippy::too_many_arguments)]
    fn ev(
        user: &str,
        verb: &str,
        group: &str,
        res: &str,
        sub: &str,
        name: &str,
        code: u16,
        resp: Value,
    ) -> String {
        json!({"stage": "ResponseComplete", "stageTimestamp": "2026-11-23T10:00:00Z", "verb": verb,
            "user": {"username": user},
            "objectRef": {"apiGroup": group, "resource": res, "subresource": sub, "namespace": "default", "name": name},
            "responseStatus": {"code": code}, "responseObject": resp})
        .to_string()
    }

    fn pdb_status(allowed: i64) -> String {
        ev(
            DISRUPTION_CONTROLLER,
            "update",
            "policy",
            "poddisruptionbudgets",
            "status",
            "web",
            200,
            json!({"spec": {"selector": {"matchLabels": {"app": "web"}}},
                   "status": {"disruptionsAllowed": allowed}}),
        )
    }

    fn pod(name: &str, ready: bool) -> String {
        ev(
            "kwok-controller",
            "patch",
            "",
            "pods",
            "status",
            name,
            200,
            json!({"metadata": {"labels": {"app": "web"}},
                   "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}}),
        )
    }

    fn evict(user: &str, name: &str, code: u16) -> String {
        ev(
            user,
            "create",
            "",
            "pods",
            "eviction",
            name,
            code,
            Value::Null,
        )
    }

    fn run(lines: &[String]) -> Vec<Violation> {
        check_audit_text(&lines.join("\n"), &[CTL]).unwrap()
    }

    #[test]
    fn budgets_published_before_the_log_are_taken_as_they_stood() {
        let lines = [pod("a", true), took(&["a"], 0), evict(CTL, "a", 201)];
        assert_eq!(
            run(&lines).len(),
            1,
            "without what the budget allowed before the log, it allowed nothing"
        );
        let before = json!({"metadata": {"namespace": "default", "name": "web"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}},
            "status": {"disruptionsAllowed": 1, "currentHealthy": 3}});
        let v = check_audit_text_from(
            &lines.join("\n"),
            &[CTL],
            std::slice::from_ref(&before),
            &[],
        )
        .unwrap();
        assert_eq!(v, vec![]);
        // One more than it allowed is still a violation.
        let two = [
            pod("a", true),
            pod("b", true),
            took(&["a"], 0),
            evict(CTL, "a", 201),
            took(&["b"], 0),
            evict(CTL, "b", 201),
        ];
        let v = check_audit_text_from(&two.join("\n"), &[CTL], &[before], &[]).unwrap();
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].pod, "default/b");
    }

    #[test]
    fn pods_made_before_the_log_are_taken_as_they_stood() {
        // A Ready pod the log never saw made, evicted while its budget allows nothing.
        let lines = [pdb_status(0), evict(CTL, "a", 201)];
        let e = check_audit_text(&lines.join("\n"), &[CTL]).unwrap_err();
        assert!(e.to_string().contains("no pod bodies"), "{e}");
        let a: Value = serde_json::from_str(&pod("a", true)).unwrap();
        let mut before = a["responseObject"].clone();
        before["metadata"]["namespace"] = json!("default");
        before["metadata"]["name"] = json!("a");
        let v = check_audit_text_from(&lines.join("\n"), &[CTL], &[], &[before]).unwrap();
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].pod, "default/a");
    }

    #[test]
    fn evictions_within_the_budget_are_safe() {
        let v = run(&[
            pod("a", true),
            pod("b", true),
            pdb_status(1),
            evict(CTL, "a", 201),
            evict(CTL, "b", 429),
            pdb_status(1),
            evict(CTL, "b", 201),
        ]);
        assert_eq!(v, vec![]);
    }

    #[test]
    fn a_second_eviction_on_the_same_budget_is_a_violation() {
        let v = run(&[
            pod("a", true),
            pod("b", true),
            pdb_status(1),
            evict(CTL, "a", 201),
            evict(CTL, "b", 201),
        ]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(
            (v[0].pod.as_str(), v[0].pdb.as_str(), v[0].how),
            ("default/b", "default/web", "evicted")
        );
    }

    #[test]
    fn a_budget_forged_by_another_user_is_not_believed() {
        let forged = ev(
            "kubernetes-admin",
            "update",
            "policy",
            "poddisruptionbudgets",
            "status",
            "web",
            200,
            json!({"spec": {"selector": {"matchLabels": {"app": "web"}}}, "status": {"disruptionsAllowed": 5}}),
        );
        let v = run(&[pod("a", true), pdb_status(0), forged, evict(CTL, "a", 201)]);
        assert_eq!(v.len(), 1, "{v:?}");
    }

    #[test]
    fn an_unready_pod_may_go_and_takes_nothing() {
        let v = run(&[
            pod("a", false),
            pod("b", true),
            pdb_status(1),
            evict(CTL, "a", 201),
            evict(CTL, "b", 201),
        ]);
        assert_eq!(v, vec![]);
    }

    #[test]
    fn a_direct_delete_at_zero_is_a_violation_and_others_users_are_not_judged() {
        let del = |u: &str| ev(u, "delete", "", "pods", "", "a", 200, Value::Null);
        assert_eq!(
            run(&[pod("a", true), pdb_status(0), del("someone-else")]),
            vec![]
        );
        let v = run(&[pod("a", true), pdb_status(0), del(CTL)]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].how, "deleted");
        // Allowed by the budget: not a violation.
        assert_eq!(run(&[pod("a", true), pdb_status(1), del(CTL)]), vec![]);
    }

    /// The Eviction API's own status write: `pods` in disruptedPods, `allowed` after it.
    fn took(pods: &[&str], allowed: i64) -> String {
        let disrupted: serde_json::Map<String, Value> = pods
            .iter()
            .map(|p| (p.to_string(), json!("2026-11-23T10:00:00Z")))
            .collect();
        ev(
            APISERVER,
            "update",
            "policy",
            "poddisruptionbudgets",
            "status",
            "web",
            200,
            json!({"spec": {"selector": {"matchLabels": {"app": "web"}}},
                   "status": {"disruptionsAllowed": allowed, "disruptedPods": disrupted}}),
        )
    }

    #[test]
    fn the_eviction_api_write_is_the_moment_of_acceptance() {
        // As a real kube-apiserver logs it: the Eviction API's write, the disruption
        // controller's recount (0: the pod is going), then the eviction's answer.
        let v = run(&[
            pod("a", true),
            pod("b", true),
            pdb_status(1),
            took(&["a"], 0),
            pdb_status(0),
            evict(CTL, "a", 201),
            pdb_status(1),
            took(&["b"], 0),
            evict(CTL, "b", 201),
        ]);
        assert_eq!(v, vec![]);
    }

    #[test]
    fn a_disruption_taken_while_the_budget_published_none_is_a_violation() {
        let v = run(&[
            pod("a", true),
            pod("b", true),
            pdb_status(1),
            took(&["a"], 0),
            evict(CTL, "a", 201),
            took(&["a", "b"], 0),
            evict(CTL, "b", 201),
        ]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!((v[0].pod.as_str(), v[0].allowed), ("default/b", 0));
    }

    /// `line` with `metadata.resourceVersion` set in its response.
    fn at_rv(line: String, rv: u64) -> String {
        let mut v: Value = serde_json::from_str(&line).unwrap();
        v["responseObject"]["metadata"]["resourceVersion"] = json!(rv.to_string());
        v.to_string()
    }

    #[test]
    fn writes_logged_out_of_order_are_replayed_in_etcds_order() {
        // The Eviction API's write (rv 12) finished after the disruption controller's recount
        // it caused (rv 13), so the log holds them the other way round.
        let late = [
            pod("a", true),
            pod("b", true),
            at_rv(pdb_status(1), 10),
            at_rv(pdb_status(0), 13),
            at_rv(took(&["a"], 0), 12),
            evict(CTL, "a", 201),
        ];
        assert_eq!(run(&late), vec![]);
        // The same, with the recount carrying the pod the Eviction API had just added to
        // disruptedPods (as the disruption controller's writes do): the take is still found at
        // its own place, not lost to the recount logged before it.
        let mut recount: Value = serde_json::from_str(&at_rv(pdb_status(0), 13)).unwrap();
        recount["responseObject"]["status"]["disruptedPods"] = json!({"a": "2026-11-23T10:00:00Z"});
        let carried = [
            pod("a", true),
            pod("b", true),
            at_rv(pdb_status(1), 10),
            recount.to_string(),
            at_rv(took(&["a"], 0), 12),
            evict(CTL, "a", 201),
        ];
        assert_eq!(run(&carried), vec![]);
        // Taken after the recount published none: a violation whatever the log's order.
        let after = [
            pod("a", true),
            pod("b", true),
            at_rv(pdb_status(1), 10),
            at_rv(took(&["a"], 0), 14),
            at_rv(pdb_status(0), 13),
            evict(CTL, "a", 201),
        ];
        let v = run(&after);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!((v[0].pod.as_str(), v[0].allowed), ("default/a", 0));
        // A second take before the recount is still one more than allowed.
        let two = [
            pod("a", true),
            pod("b", true),
            at_rv(pdb_status(1), 10),
            at_rv(pdb_status(0), 14),
            at_rv(took(&["a"], 0), 11),
            evict(CTL, "a", 201),
            at_rv(took(&["a", "b"], -1), 12),
            evict(CTL, "b", 201),
        ];
        let v = run(&two);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].pod, "default/b");
    }

    #[test]
    fn evictions_logged_out_of_order_with_each_other_take_one_disruption_each() {
        // The Eviction API's write for b (rv 12, its set already holding a) finished before the
        // one for a (rv 11): a is taken once, not once for each write that holds it.
        let lines = [
            pod("a", true),
            pod("b", true),
            pod("c", true),
            at_rv(pdb_status(3), 10),
            at_rv(took(&["a", "b"], 1), 12),
            at_rv(took(&["a"], 2), 11),
            evict(CTL, "b", 201),
            evict(CTL, "a", 201),
            at_rv(took(&["a", "b", "c"], 0), 13),
            evict(CTL, "c", 201),
        ];
        assert_eq!(run(&lines), vec![]);
        // A fourth eviction is still one more than the budget allowed.
        let mut four = lines.to_vec();
        four.insert(0, pod("d", true));
        four.push(at_rv(took(&["a", "b", "c", "d"], -1), 14));
        four.push(evict(CTL, "d", 201));
        let v = run(&four);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!((v[0].pod.as_str(), v[0].allowed), ("default/d", 0));
    }

    #[test]
    fn selectors() {
        let l: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
        assert!(selects(&json!({"matchLabels": {"app": "web"}}), &l));
        assert!(!selects(&json!({"matchLabels": {"app": "db"}}), &l));
        assert!(selects(
            &json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}),
            &l
        ));
        assert!(
            !selects(&json!({}), &l),
            "an empty selector selects nothing"
        );
    }
}
