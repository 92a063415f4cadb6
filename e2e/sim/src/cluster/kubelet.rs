//! Node-side simulation: node heartbeats (Ready, unreachable taints), binding pending pods via
//! the scheduler, pod startup, scripted exits, graceful termination and pod garbage collection.

use std::collections::HashMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::scheduler::{self, NodeInfo};
use super::{Wake, World, annotations as ann, name, namespace, phase, terminating};
use crate::api::{Api, Ctx, DeleteOpts, set_condition};
use crate::clock::{format_time, parse_time};

fn annotation<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.pointer("/metadata/annotations")
        .and_then(|a| a.get(k))
        .and_then(Value::as_str)
}

fn dur(s: Option<&str>, default: Duration) -> Duration {
    s.and_then(|s| ebb_api::parse_duration(s).ok())
        .unwrap_or(default)
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::ZERO))
        .unwrap_or(t)
}

const UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// Keeps node Ready conditions and unreachable taints in line with the `down` annotation.
pub fn nodes(api: &Api, w: &World) {
    let Some(ri) = api.resolve("", "v1", "nodes") else {
        return;
    };
    let now = format_time(w.now);
    for n in &w.nodes {
        let down = annotation(n, ann::NODE_DOWN) == Some("true");
        let mut new = (**n).clone();
        if down {
            set_condition(
                &mut new,
                "Ready",
                "Unknown",
                "NodeStatusUnknown",
                "Kubelet stopped posting node status.",
                &now,
            );
        } else {
            set_condition(
                &mut new,
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
                &now,
            );
        }
        let mut taints: Vec<Value> = new
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let has = taints
            .iter()
            .any(|t| t.get("key").and_then(Value::as_str) == Some(UNREACHABLE));
        if down && !has {
            taints.push(json!({"key": UNREACHABLE, "effect": "NoSchedule", "timeAdded": now}));
            taints.push(json!({"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": now}));
        } else if !down && has {
            taints.retain(|t| t.get("key").and_then(Value::as_str) != Some(UNREACHABLE));
        }
        let status_changed = new.get("status") != n.get("status");
        let cur = if status_changed {
            match api.system_status("kubelet", &ri, n, new.clone()) {
                Ok(c) => c,
                Err(_) => continue,
            }
        } else {
            n.clone()
        };
        let old_taints = cur
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if old_taints != taints {
            let mut t = (*cur).clone();
            t["spec"]["taints"] = json!(taints);
            let _ = api.system_update("node-lifecycle-controller", &ri, &cur, t);
        }
    }
}

/// Binds pending, ungated, unbound pods to nodes that fit.
pub fn schedule(api: &Api, w: &World) {
    let Some(pods_ri) = api.resolve("", "v1", "pods") else {
        return;
    };
    let pending: Vec<&std::sync::Arc<Value>> = w
        .pods
        .iter()
        .filter(|p| {
            p.pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
                && !terminating(p)
                && phase(p) == "Pending"
                && p.pointer("/spec/schedulingGates")
                    .and_then(Value::as_array)
                    .is_none_or(Vec::is_empty)
                && p.pointer("/spec/schedulerName")
                    .and_then(Value::as_str)
                    .is_none_or(|s| s == "default-scheduler")
        })
        .collect();
    if pending.is_empty() {
        return;
    }
    let mut infos: Vec<NodeInfo> = w.nodes.iter().map(|n| NodeInfo::from_node(n)).collect();
    let index: HashMap<String, usize> = infos
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), i))
        .collect();
    for p in &w.pods {
        if let Some(n) = p.pointer("/spec/nodeName").and_then(Value::as_str)
            && let Some(&i) = index.get(n)
            && !matches!(phase(p), "Succeeded" | "Failed")
        {
            infos[i].add_pod(p);
        }
    }
    let ctx = Ctx::system("kube-scheduler");
    let now = format_time(w.now);
    let mut bound = 0usize;
    for p in pending {
        match scheduler::pick(p, &infos) {
            Ok(i) => {
                let node = infos[i].name.clone();
                if api
                    .bind(&ctx, &pods_ri, namespace(p), name(p), &node)
                    .is_ok()
                {
                    infos[i].add_pod(p);
                    bound += 1;
                }
            }
            Err(msg) => {
                let mut n = (**p).clone();
                set_condition(&mut n, "PodScheduled", "False", "Unschedulable", &msg, &now);
                if n.get("status") != p.get("status") {
                    let _ = api.system_status("kube-scheduler", &pods_ri, p, n);
                }
            }
        }
    }
    if bound > 100 {
        tracing::info!(bound, "scheduler: pods bound");
    }
}

fn container_statuses(
    pod: &Value,
    state: &Value,
    ready: bool,
    restarts: i64,
    last: Option<&Value>,
) -> Value {
    let cs: Vec<Value> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let n = c.get("name").and_then(Value::as_str).unwrap_or("");
            let mut s = json!({"name": n, "image": c.get("image").cloned().unwrap_or(json!("")),
                "imageID": format!("sim://{}", c.get("image").and_then(Value::as_str).unwrap_or("")),
                "containerID": format!("sim://{}-{n}", super::uid(pod)), "ready": ready,
                "started": state.get("running").is_some(), "restartCount": restarts, "state": state});
            if let Some(l) = last {
                s["lastState"] = l.clone();
            }
            s
        })
        .collect();
    json!(cs)
}

/// When the node's `NoExecute` taints evict `pod`: at once for an untolerated taint, or when the
/// shortest `tolerationSeconds` of a matching toleration has passed since the taint's `timeAdded`.
fn no_execute_deadline(pod: &Value, node: &Value) -> Option<Timestamp> {
    let tolerations = pod
        .pointer("/spec/tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut deadline: Option<Timestamp> = None;
    for t in node
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if t.get("effect").and_then(Value::as_str) != Some("NoExecute") {
            continue;
        }
        let added = t
            .get("timeAdded")
            .and_then(Value::as_str)
            .and_then(parse_time)
            .unwrap_or(Timestamp::UNIX_EPOCH);
        let matching: Vec<&Value> = tolerations
            .iter()
            .filter(|tol| scheduler::tolerates(std::slice::from_ref(tol), t))
            .collect();
        let at = if matching.is_empty() {
            Some(Timestamp::UNIX_EPOCH)
        } else if matching
            .iter()
            .any(|m| m.get("tolerationSeconds").is_none())
        {
            None
        } else {
            let secs = matching
                .iter()
                .filter_map(|m| m.get("tolerationSeconds").and_then(Value::as_i64))
                .min()
                .unwrap_or(0);
            Some(plus(added, Duration::from_secs(secs.max(0) as u64)))
        };
        if let Some(a) = at
            && deadline.is_none_or(|d| a < d)
        {
            deadline = Some(a);
        }
    }
    deadline
}

/// Pod lifecycle on nodes: start, scripted exits, readiness with node health, termination.
pub fn pods(api: &Api, w: &World, wake: &mut Wake) {
    let Some(ri) = api.resolve("", "v1", "pods") else {
        return;
    };
    let nodes: HashMap<&str, &std::sync::Arc<Value>> =
        w.nodes.iter().map(|n| (name(n), n)).collect();
    let now = w.now;
    let now_s = format_time(now);
    let kubelet = Ctx::system("kubelet");
    for p in &w.pods {
        let Some(node_name) = p
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        let Some(node) = nodes.get(node_name) else {
            // Pod GC: pods bound to a node that no longer exists are deleted at once.
            let _ = api.delete(
                &Ctx::system("pod-garbage-collector"),
                &ri,
                namespace(p),
                name(p),
                &DeleteOpts {
                    grace: Some(0),
                    ..Default::default()
                },
            );
            continue;
        };
        let node_ready = annotation(node, ann::NODE_DOWN) != Some("true");
        if terminating(p) {
            let at = p
                .pointer("/metadata/deletionTimestamp")
                .and_then(Value::as_str)
                .and_then(parse_time)
                .unwrap_or(now);
            // A down node's kubelet cannot confirm the end: the pod stays Terminating until the
            // node comes back or is deleted (or someone force-deletes it), as in Kubernetes.
            if !node_ready {
                continue;
            }
            if at <= now {
                let _ = api.delete(
                    &kubelet,
                    &ri,
                    namespace(p),
                    name(p),
                    &DeleteOpts {
                        grace: Some(0),
                        ..Default::default()
                    },
                );
            } else {
                wake.at(at);
            }
            continue;
        }
        if let Some(at) = no_execute_deadline(p, node) {
            if at <= now {
                let ctx = Ctx::system("taint-eviction-controller");
                let _ = api.delete(&ctx, &ri, namespace(p), name(p), &DeleteOpts::default());
                continue;
            }
            wake.at(at);
        }
        let mut new = (**p).clone();
        match phase(p) {
            "Pending" => {
                if !node_ready {
                    continue;
                }
                let bound_at = p
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .find(|c| c.get("type").and_then(Value::as_str) == Some("PodScheduled"))
                    .and_then(|c| c.get("lastTransitionTime").and_then(Value::as_str))
                    .and_then(parse_time)
                    // Created with spec.nodeName (no scheduler): bound since its creation.
                    .or_else(|| {
                        p.pointer("/metadata/creationTimestamp")
                            .and_then(Value::as_str)
                            .and_then(parse_time)
                    })
                    .unwrap_or(now);
                let start_at = plus(
                    bound_at,
                    dur(annotation(p, ann::START_DELAY), Duration::from_secs(1)),
                );
                if start_at > now {
                    wake.at(start_at);
                    continue;
                }
                let fail = annotation(p, ann::FAIL_START) == Some("true");
                let state = if fail {
                    json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}})
                } else {
                    json!({"running": {"startedAt": now_s}})
                };
                new["status"]["phase"] = json!("Running");
                new["status"]["startTime"] = json!(now_s);
                new["status"]["hostIP"] = node
                    .pointer("/status/addresses/0/address")
                    .cloned()
                    .unwrap_or(json!("10.0.0.1"));
                let h = super::uid(p)
                    .bytes()
                    .fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(b as u32));
                new["status"]["podIP"] =
                    json!(format!("10.244.{}.{}", (h >> 8) % 250, h % 250 + 2));
                new["status"]["containerStatuses"] = container_statuses(p, &state, !fail, 0, None);
                let ready = if fail { "False" } else { "True" };
                set_condition(&mut new, "Initialized", "True", "", "", &now_s);
                set_condition(&mut new, "ContainersReady", ready, "", "", &now_s);
                set_condition(&mut new, "Ready", ready, "", "", &now_s);
            }
            "Running" => {
                let ready = node_ready && annotation(p, ann::FAIL_START) != Some("true");
                let r = if ready { "True" } else { "False" };
                set_condition(&mut new, "Ready", r, "", "", &now_s);
                set_condition(&mut new, "ContainersReady", r, "", "", &now_s);
                let owned_by_job = p
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|o| {
                        o.iter()
                            .any(|o| o.get("kind").and_then(Value::as_str) == Some("Job"))
                    });
                let (after, code, reason) = if let Some(t) = annotation(p, ann::OOM_AFTER) {
                    (Some(dur(Some(t), Duration::ZERO)), 137, "OOMKilled")
                } else if let Some(t) = annotation(p, ann::EXIT_AFTER) {
                    let code = annotation(p, ann::EXIT_CODE)
                        .and_then(|c| c.parse().ok())
                        .unwrap_or(0);
                    (
                        Some(dur(Some(t), Duration::ZERO)),
                        code,
                        if code == 0 { "Completed" } else { "Error" },
                    )
                } else if owned_by_job {
                    (Some(Duration::from_secs(1)), 0, "Completed")
                } else {
                    (None, 0, "")
                };
                if let Some(after) = after {
                    let started = p
                        .pointer("/status/containerStatuses/0/state/running/startedAt")
                        .and_then(Value::as_str)
                        .and_then(parse_time);
                    if let Some(started) = started {
                        let at = plus(started, after);
                        if at > now {
                            wake.at(at);
                        } else {
                            let term = json!({"terminated": {"exitCode": code, "reason": reason, "startedAt": format_time(started), "finishedAt": now_s}});
                            let policy = p
                                .pointer("/spec/restartPolicy")
                                .and_then(Value::as_str)
                                .unwrap_or("Always");
                            let restarts = p
                                .pointer("/status/containerStatuses/0/restartCount")
                                .and_then(Value::as_i64)
                                .unwrap_or(0);
                            if policy == "Always" || (policy == "OnFailure" && code != 0) {
                                let state = json!({"running": {"startedAt": now_s}});
                                new["status"]["containerStatuses"] =
                                    container_statuses(p, &state, true, restarts + 1, Some(&term));
                            } else {
                                new["status"]["phase"] =
                                    json!(if code == 0 { "Succeeded" } else { "Failed" });
                                new["status"]["containerStatuses"] =
                                    container_statuses(p, &term, false, restarts, None);
                                set_condition(
                                    &mut new,
                                    "Ready",
                                    "False",
                                    "PodCompleted",
                                    "",
                                    &now_s,
                                );
                                set_condition(
                                    &mut new,
                                    "ContainersReady",
                                    "False",
                                    "PodCompleted",
                                    "",
                                    &now_s,
                                );
                            }
                        }
                    }
                }
            }
            _ => continue,
        }
        if new.get("status") != p.get("status") {
            let _ = api.system_status("kubelet", &ri, p, new);
        }
    }
}
