//! Workload controllers at the level e2e tests need: Deployment → ReplicaSet (one per template
//! hash, old ones scaled to zero), ReplicaSet, StatefulSet (ordinal names), DaemonSet and Job.

use std::sync::Arc;

use serde_json::{Value, json};

use super::scheduler::{NodeInfo, tolerates};
use super::{Wake, World, active, name, namespace, phase, terminating, uid};
use crate::api::{Api, Ctx, DeleteOpts, pod_ready, set_condition};
use crate::clock::format_time;
use crate::registry::ResourceInfo;

fn int(v: &Value, ptr: &str, default: i64) -> i64 {
    v.pointer(ptr).and_then(Value::as_i64).unwrap_or(default)
}

fn owner_ref(o: &Value, kind: &str) -> Value {
    json!({"apiVersion": o.get("apiVersion").cloned().unwrap_or(json!("apps/v1")), "kind": kind,
        "name": name(o), "uid": uid(o), "controller": true, "blockOwnerDeletion": true})
}

/// A pod from a workload's template.
fn pod_from_template(owner: &Value, kind: &str, pod_name: Option<&str>, generate: &str) -> Value {
    let t = owner
        .pointer("/spec/template")
        .cloned()
        .unwrap_or(json!({}));
    let mut meta = json!({"namespace": namespace(owner), "labels": t.pointer("/metadata/labels").cloned().unwrap_or(json!({})),
        "ownerReferences": [owner_ref(owner, kind)]});
    if let Some(a) = t.pointer("/metadata/annotations") {
        meta["annotations"] = a.clone();
    }
    match pod_name {
        Some(n) => meta["name"] = json!(n),
        None => meta["generateName"] = json!(generate),
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": t.get("spec").cloned().unwrap_or(json!({}))})
}

fn pods_of<'a>(w: &'a World, owner: &Value) -> &'a [Arc<Value>] {
    w.pods_by_owner
        .get(uid(owner))
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn write_status(api: &Api, component: &str, ri: &ResourceInfo, obj: &Arc<Value>, status: Value) {
    let mut merged = obj.get("status").cloned().unwrap_or(json!({}));
    if let (Some(m), Some(s)) = (merged.as_object_mut(), status.as_object()) {
        for (k, v) in s {
            m.insert(k.clone(), v.clone());
        }
    }
    if obj.get("status") != Some(&merged) {
        let mut n = (**obj).clone();
        n["status"] = merged;
        let _ = api.system_status(component, ri, obj, n);
    }
}

fn create_pod(api: &Api, component: &str, pod: Value) {
    let Some(ri) = api.resolve("", "v1", "pods") else {
        return;
    };
    let ns = namespace(&pod).to_string();
    if let Err(e) = api.create(&Ctx::system(component), &ri, &ns, pod) {
        tracing::debug!(error = %e, component, "cannot create pod");
    }
}

fn delete_pod(api: &Api, component: &str, p: &Value) {
    if let Some(ri) = api.resolve("", "v1", "pods") {
        let _ = api.delete(
            &Ctx::system(component),
            &ri,
            namespace(p),
            name(p),
            &DeleteOpts::default(),
        );
    }
}

fn template_hash(d: &Value) -> String {
    let t = d
        .pointer("/spec/template")
        .map(|t| t.to_string())
        .unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in t.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    const CH: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..10)
        .map(|i| CH[((h >> (i * 6)) % CH.len() as u64) as usize] as char)
        .collect()
}

/// Deployments: one ReplicaSet per pod-template hash; the current one has `spec.replicas`,
/// older ones are scaled to zero.
pub fn deployments(api: &Api, w: &World) {
    let (Some(dri), Some(rsri)) = (
        api.resolve("apps", "v1", "deployments"),
        api.resolve("apps", "v1", "replicasets"),
    ) else {
        return;
    };
    let all_rs = api.snapshot("apps", "replicasets");
    let ctx = Ctx::system("deployment-controller");
    for d in api.snapshot("apps", "deployments") {
        if terminating(&d) {
            continue;
        }
        let hash = template_hash(&d);
        let replicas = int(&d, "/spec/replicas", 1);
        let owned: Vec<&Arc<Value>> = all_rs
            .iter()
            .filter(|r| super::controller_uid(r) == Some(uid(&d)))
            .collect();
        let current = owned.iter().find(|r| {
            r.pointer("/metadata/labels/pod-template-hash")
                .and_then(Value::as_str)
                == Some(hash.as_str())
        });
        match current {
            None => {
                let mut t = d.pointer("/spec/template").cloned().unwrap_or(json!({}));
                t["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                let mut sel = d.pointer("/spec/selector").cloned().unwrap_or(json!({}));
                sel["matchLabels"]["pod-template-hash"] = json!(hash);
                let mut labels = t.pointer("/metadata/labels").cloned().unwrap_or(json!({}));
                labels["pod-template-hash"] = json!(hash);
                let rs = json!({"metadata": {"name": format!("{}-{hash}", name(&d)), "namespace": namespace(&d),
                    "labels": labels, "ownerReferences": [owner_ref(&d, "Deployment")],
                    "annotations": {"deployment.kubernetes.io/revision": (owned.len() + 1).to_string()}},
                    "spec": {"replicas": replicas, "selector": sel, "template": t}});
                let _ = api.create(&ctx, &rsri, namespace(&d), rs);
            }
            Some(rs) => {
                if int(rs, "/spec/replicas", 1) != replicas {
                    let mut n = (***rs).clone();
                    n["spec"]["replicas"] = json!(replicas);
                    let _ = api.system_update("deployment-controller", &rsri, rs, n);
                }
            }
        }
        for old in owned.iter().filter(|r| {
            r.pointer("/metadata/labels/pod-template-hash")
                .and_then(Value::as_str)
                != Some(hash.as_str())
        }) {
            if int(old, "/spec/replicas", 1) != 0 {
                let mut n = (***old).clone();
                n["spec"]["replicas"] = json!(0);
                let _ = api.system_update("deployment-controller", &rsri, old, n);
            }
        }
        let sum = |p: &str| owned.iter().map(|r| int(r, p, 0)).sum::<i64>();
        let updated = current.map(|r| int(r, "/status/replicas", 0)).unwrap_or(0);
        let available = sum("/status/availableReplicas");
        let max_unavailable = match d.pointer("/spec/strategy/rollingUpdate/maxUnavailable") {
            Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
            Some(Value::String(s)) => s
                .trim_end_matches('%')
                .parse::<i64>()
                .map(|p| replicas * p / 100)
                .unwrap_or(0),
            _ => replicas / 4,
        };
        let now = format_time(w.now);
        let mut st = (*d).clone();
        st["status"]["observedGeneration"] = json!(int(&d, "/metadata/generation", 1));
        st["status"]["replicas"] = json!(sum("/status/replicas"));
        st["status"]["updatedReplicas"] = json!(updated);
        st["status"]["readyReplicas"] = json!(sum("/status/readyReplicas"));
        st["status"]["availableReplicas"] = json!(available);
        st["status"]["unavailableReplicas"] = json!((replicas - available).max(0));
        let avail = available >= replicas - max_unavailable;
        set_condition(
            &mut st,
            "Available",
            if avail { "True" } else { "False" },
            if avail {
                "MinimumReplicasAvailable"
            } else {
                "MinimumReplicasUnavailable"
            },
            if avail {
                "Deployment has minimum availability."
            } else {
                "Deployment does not have minimum availability."
            },
            &now,
        );
        let done = updated == replicas && available >= replicas;
        set_condition(
            &mut st,
            "Progressing",
            "True",
            if done {
                "NewReplicaSetAvailable"
            } else {
                "ReplicaSetUpdated"
            },
            "",
            &now,
        );
        let status = st["status"].clone();
        write_status(api, "deployment-controller", &dri, &d, status);
    }
}

/// ReplicaSets: create or delete pods to match `spec.replicas`.
pub fn replicasets(api: &Api, w: &World) {
    let Some(ri) = api.resolve("apps", "v1", "replicasets") else {
        return;
    };
    for rs in api.snapshot("apps", "replicasets") {
        if terminating(&rs) {
            continue;
        }
        let want = int(&rs, "/spec/replicas", 1);
        let pods: Vec<&Arc<Value>> = pods_of(w, &rs).iter().filter(|p| active(p)).collect();
        let have = pods.len() as i64;
        if have < want {
            for _ in 0..(want - have) {
                create_pod(
                    api,
                    "replicaset-controller",
                    pod_from_template(&rs, "ReplicaSet", None, &format!("{}-", name(&rs))),
                );
            }
        } else if have > want {
            let mut victims = pods.clone();
            victims.sort_by_key(|p| {
                (
                    p.pointer("/spec/nodeName").is_some(),
                    pod_ready(p),
                    std::cmp::Reverse(
                        p.pointer("/metadata/creationTimestamp")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    ),
                )
            });
            for p in victims.iter().take((have - want) as usize) {
                delete_pod(api, "replicaset-controller", p);
            }
        }
        let ready = pods.iter().filter(|p| pod_ready(p)).count();
        write_status(
            api,
            "replicaset-controller",
            &ri,
            &rs,
            json!({"replicas": have, "readyReplicas": ready,
            "availableReplicas": ready, "fullyLabeledReplicas": have, "observedGeneration": int(&rs, "/metadata/generation", 1)}),
        );
    }
}

/// StatefulSets: pods `<name>-<ordinal>`, created in order (OrderedReady) or all at once
/// (Parallel), recreated under the same name, removed from the highest ordinal.
pub fn statefulsets(api: &Api, w: &World, _wake: &mut Wake) {
    let Some(ri) = api.resolve("apps", "v1", "statefulsets") else {
        return;
    };
    for s in api.snapshot("apps", "statefulsets") {
        if terminating(&s) {
            continue;
        }
        let want = int(&s, "/spec/replicas", 1);
        let parallel = s
            .pointer("/spec/podManagementPolicy")
            .and_then(Value::as_str)
            == Some("Parallel");
        let pods = pods_of(w, &s);
        let by_name = |n: &str| pods.iter().find(|p| name(p) == n);
        for i in 0..want {
            let pn = format!("{}-{i}", name(&s));
            match by_name(&pn) {
                Some(p) if terminating(p) => {
                    if !parallel {
                        break;
                    }
                }
                Some(p) => {
                    if matches!(phase(p), "Failed" | "Succeeded") {
                        delete_pod(api, "statefulset-controller", p);
                    }
                    if !parallel && !pod_ready(p) {
                        break;
                    }
                }
                None => {
                    let mut pod = pod_from_template(&s, "StatefulSet", Some(&pn), "");
                    pod["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] = json!(pn);
                    pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"] =
                        json!(i.to_string());
                    pod["spec"]["hostname"] = json!(pn);
                    if let Some(svc) = s.pointer("/spec/serviceName") {
                        pod["spec"]["subdomain"] = svc.clone();
                    }
                    create_pod(api, "statefulset-controller", pod);
                    if !parallel {
                        break;
                    }
                }
            }
        }
        let mut extra: Vec<(i64, &Arc<Value>)> = pods
            .iter()
            .filter(|p| !terminating(p))
            .filter_map(|p| {
                name(p)
                    .rsplit_once('-')
                    .and_then(|(_, o)| o.parse::<i64>().ok())
                    .map(|o| (o, p))
            })
            .filter(|(o, _)| *o >= want)
            .collect();
        extra.sort_by_key(|(o, _)| std::cmp::Reverse(*o));
        if let Some((_, p)) = extra.first() {
            delete_pod(api, "statefulset-controller", p);
        }
        let act = pods.iter().filter(|p| active(p)).count();
        let ready = pods.iter().filter(|p| active(p) && pod_ready(p)).count();
        write_status(
            api,
            "statefulset-controller",
            &ri,
            &s,
            json!({"replicas": act, "readyReplicas": ready,
            "currentReplicas": act, "updatedReplicas": act, "availableReplicas": ready,
            "observedGeneration": int(&s, "/metadata/generation", 1)}),
        );
    }
}

/// DaemonSets: one pod per eligible node, pinned with required node affinity on the node name.
pub fn daemonsets(api: &Api, w: &World) {
    let Some(ri) = api.resolve("apps", "v1", "daemonsets") else {
        return;
    };
    let infos: Vec<NodeInfo> = w.nodes.iter().map(|n| NodeInfo::from_node(n)).collect();
    for ds in api.snapshot("apps", "daemonsets") {
        if terminating(&ds) {
            continue;
        }
        let mut probe = pod_from_template(&ds, "DaemonSet", Some("probe"), "");
        let mut tols = probe
            .pointer("/spec/tolerations")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (k, e) in [
            ("node.kubernetes.io/not-ready", "NoExecute"),
            ("node.kubernetes.io/unreachable", "NoExecute"),
            ("node.kubernetes.io/disk-pressure", "NoSchedule"),
            ("node.kubernetes.io/memory-pressure", "NoSchedule"),
            ("node.kubernetes.io/pid-pressure", "NoSchedule"),
            ("node.kubernetes.io/unschedulable", "NoSchedule"),
        ] {
            tols.push(json!({"key": k, "operator": "Exists", "effect": e}));
        }
        probe["spec"]["tolerations"] = json!(tols);
        let pods = pods_of(w, &ds);
        let mut desired = 0;
        for n in &infos {
            let eligible = {
                let sel_ok = probe
                    .pointer("/spec/nodeSelector")
                    .and_then(Value::as_object)
                    .is_none_or(|s| s.iter().all(|(k, v)| n.labels.get(k) == Some(v)));
                let taints_ok = n.taints.iter().all(|t| {
                    t.get("effect").and_then(Value::as_str) == Some("PreferNoSchedule")
                        || tolerates(&tols, t)
                });
                sel_ok && taints_ok
            };
            let mine: Vec<&Arc<Value>> = pods.iter().filter(|p| {
                p.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0/values/0")
                    .and_then(Value::as_str) == Some(n.name.as_str())
            }).collect();
            if eligible {
                desired += 1;
                if !mine.iter().any(|p| active(p)) && !mine.iter().any(|p| terminating(p)) {
                    let mut pod = probe.clone();
                    if let Some(m) = pod["metadata"].as_object_mut() {
                        m.remove("name");
                        m.insert("generateName".into(), json!(format!("{}-", name(&ds))));
                    }
                    pod["spec"]["affinity"]["nodeAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n.name]}]}]}});
                    create_pod(api, "daemonset-controller", pod);
                }
            } else {
                for p in mine.iter().filter(|p| !terminating(p)) {
                    delete_pod(api, "daemonset-controller", p);
                }
            }
        }
        let node_names: Vec<&str> = infos.iter().map(|n| n.name.as_str()).collect();
        for p in pods.iter().filter(|p| !terminating(p)) {
            let target = p.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0/values/0").and_then(Value::as_str).unwrap_or("");
            if !node_names.contains(&target) {
                delete_pod(api, "daemonset-controller", p);
            }
        }
        let current = pods
            .iter()
            .filter(|p| active(p) && p.pointer("/spec/nodeName").is_some())
            .count();
        let ready = pods.iter().filter(|p| active(p) && pod_ready(p)).count();
        write_status(
            api,
            "daemonset-controller",
            &ri,
            &ds,
            json!({"desiredNumberScheduled": desired,
            "currentNumberScheduled": current, "numberReady": ready, "updatedNumberScheduled": current,
            "numberAvailable": ready, "numberMisscheduled": 0, "observedGeneration": int(&ds, "/metadata/generation", 1)}),
        );
    }
}

/// Jobs: run pods until `completions` succeeded (at most `parallelism` at once) or more than
/// `backoffLimit` failed.
pub fn jobs(api: &Api, w: &World) {
    let Some(ri) = api.resolve("batch", "v1", "jobs") else {
        return;
    };
    let now = format_time(w.now);
    for j in api.snapshot("batch", "jobs") {
        if terminating(&j) {
            continue;
        }
        let pods = pods_of(w, &j);
        let succeeded = pods.iter().filter(|p| phase(p) == "Succeeded").count() as i64;
        let failed = pods.iter().filter(|p| phase(p) == "Failed").count() as i64;
        let act = pods.iter().filter(|p| active(p)).count() as i64;
        let completions = int(&j, "/spec/completions", 1);
        let parallelism = int(&j, "/spec/parallelism", 1);
        let backoff = int(&j, "/spec/backoffLimit", 6);
        let mut st = (*j).clone();
        let finished = j
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| {
                matches!(
                    c.get("type").and_then(Value::as_str),
                    Some("Complete" | "Failed")
                ) && c.get("status").and_then(Value::as_str) == Some("True")
            });
        if !finished {
            if succeeded >= completions {
                set_condition(
                    &mut st,
                    "SuccessCriteriaMet",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                    &now,
                );
                set_condition(
                    &mut st,
                    "Complete",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                    &now,
                );
                st["status"]["completionTime"] = json!(now);
            } else if failed > backoff {
                set_condition(
                    &mut st,
                    "FailureTarget",
                    "True",
                    "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit",
                    &now,
                );
                set_condition(
                    &mut st,
                    "Failed",
                    "True",
                    "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit",
                    &now,
                );
            } else {
                let need = (completions - succeeded - act)
                    .min(parallelism - act)
                    .max(0);
                for _ in 0..need {
                    create_pod(
                        api,
                        "job-controller",
                        pod_from_template(&j, "Job", None, &format!("{}-", name(&j))),
                    );
                }
            }
        }
        if j.pointer("/status/startTime").is_none() {
            st["status"]["startTime"] = json!(now);
        }
        st["status"]["active"] = json!(act);
        st["status"]["succeeded"] = json!(succeeded);
        st["status"]["failed"] = json!(failed);
        st["status"]["ready"] = json!(pods.iter().filter(|p| active(p) && pod_ready(p)).count());
        let status = st["status"].clone();
        write_status(api, "job-controller", &ri, &j, status);
    }
}
