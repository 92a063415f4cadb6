//! Built-in kinds' defaulting and admission checks on create and update: the part of the
//! apiserver's per-kind strategies the simulator reproduces (pods, workloads, services, ...).

use serde_json::{Value, json};

use crate::registry::ResourceInfo;
use crate::selector::LabelSelector;

fn set_default(obj: &mut Value, ptr: &str, v: Value) {
    if obj.pointer(ptr).is_some() {
        return;
    }
    let mut cur = obj;
    let parts: Vec<&str> = ptr.trim_start_matches('/').split('/').collect();
    for (i, p) in parts.iter().enumerate() {
        if !cur.is_object() {
            return;
        }
        let last = i + 1 == parts.len();
        let Some(m) = cur.as_object_mut() else { return };
        if last {
            m.insert((*p).to_string(), v);
            return;
        }
        cur = m.entry((*p).to_string()).or_insert_with(|| json!({}));
    }
}

/// Pod spec defaults, at `prefix` (`` for a pod, `/spec/template` for workloads).
fn pod_spec_defaults(obj: &mut Value, prefix: &str, with_tolerations: bool) {
    let s = format!("{prefix}/spec");
    set_default(obj, &format!("{s}/restartPolicy"), json!("Always"));
    set_default(
        obj,
        &format!("{s}/terminationGracePeriodSeconds"),
        json!(30),
    );
    set_default(obj, &format!("{s}/dnsPolicy"), json!("ClusterFirst"));
    set_default(
        obj,
        &format!("{s}/schedulerName"),
        json!("default-scheduler"),
    );
    set_default(obj, &format!("{s}/securityContext"), json!({}));
    if with_tolerations {
        set_default(obj, &format!("{s}/serviceAccountName"), json!("default"));
        set_default(obj, &format!("{s}/priority"), json!(0));
        set_default(obj, &format!("{s}/enableServiceLinks"), json!(true));
        if let Some(tols) = obj.pointer_mut(&s).and_then(Value::as_object_mut) {
            let list = tols.entry("tolerations").or_insert_with(|| json!([]));
            if let Some(arr) = list.as_array_mut() {
                for key in [
                    "node.kubernetes.io/not-ready",
                    "node.kubernetes.io/unreachable",
                ] {
                    if !arr
                        .iter()
                        .any(|t| t.get("key").and_then(Value::as_str) == Some(key))
                    {
                        arr.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
                    }
                }
            }
        }
    }
    if let Some(cs) = obj
        .pointer_mut(&format!("{s}/containers"))
        .and_then(Value::as_array_mut)
    {
        for c in cs {
            // Always for an image without a tag or tagged `latest`, as the real defaulting.
            let image = c.get("image").and_then(Value::as_str).unwrap_or("");
            let last = image.rsplit('/').next().unwrap_or("");
            let latest =
                !image.contains('@') && last.split_once(':').is_none_or(|(_, tag)| tag == "latest");
            let policy = if latest { "Always" } else { "IfNotPresent" };
            set_default(c, "/imagePullPolicy", json!(policy));
            if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
                for p in ports {
                    set_default(p, "/protocol", json!("TCP"));
                }
            }
            set_default(c, "/terminationMessagePath", json!("/dev/termination-log"));
            set_default(c, "/terminationMessagePolicy", json!("File"));
            set_default(c, "/resources", json!({}));
        }
    }
}

/// QoS class of a pod from its containers' requests and limits.
pub fn qos_class(pod: &Value) -> &'static str {
    let cs = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut any = false;
    let mut guaranteed = !cs.is_empty();
    for c in &cs {
        let req = c.pointer("/resources/requests").and_then(Value::as_object);
        let lim = c.pointer("/resources/limits").and_then(Value::as_object);
        if req.is_some_and(|m| !m.is_empty()) || lim.is_some_and(|m| !m.is_empty()) {
            any = true;
        }
        for r in ["cpu", "memory"] {
            let l = lim.and_then(|m| m.get(r));
            let q = req.and_then(|m| m.get(r)).or(l);
            if l.is_none() || q != l {
                guaranteed = false;
            }
        }
    }
    if guaranteed {
        "Guaranteed"
    } else if any {
        "Burstable"
    } else {
        "BestEffort"
    }
}

/// Defaults and status reset on create, per kind.
pub fn on_create(
    ri: &ResourceInfo,
    obj: &mut Value,
    uid: &str,
    cluster_ip: impl FnOnce() -> String,
) {
    if !ri.builtin {
        return;
    }
    let wl = |o: &mut Value| {
        if let Some(st) = o.as_object_mut() {
            st.remove("status");
        }
    };
    match (ri.group.as_str(), ri.plural.as_str()) {
        ("", "pods") => {
            pod_spec_defaults(obj, "", true);
            let qos = qos_class(obj);
            let gated = obj
                .pointer("/spec/schedulingGates")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            let mut status = json!({"phase": "Pending", "qosClass": qos});
            if gated {
                status["conditions"] = json!([{"type": "PodScheduled", "status": "False",
                    "reason": "SchedulingGated", "message": "Scheduling is blocked due to non-empty scheduling gates"}]);
            }
            obj["status"] = status;
        }
        ("", "namespaces") => {
            let name = obj
                .pointer("/metadata/name")
                .cloned()
                .unwrap_or(Value::Null);
            set_default(
                obj,
                "/metadata/labels/kubernetes.io~1metadata.name",
                name.clone(),
            );
            if let Some(l) = obj
                .pointer_mut("/metadata/labels")
                .and_then(Value::as_object_mut)
            {
                l.remove("kubernetes.io~1metadata.name");
                l.insert("kubernetes.io/metadata.name".into(), name);
            }
            obj["status"] = json!({"phase": "Active"});
        }
        ("", "services") => {
            set_default(obj, "/spec/type", json!("ClusterIP"));
            set_default(obj, "/spec/sessionAffinity", json!("None"));
            if obj.pointer("/spec/clusterIP").is_none() {
                obj["spec"]["clusterIP"] = json!(cluster_ip());
                obj["spec"]["clusterIPs"] = json!([obj["spec"]["clusterIP"].clone()]);
            }
            if let Some(ps) = obj.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
                for p in ps {
                    set_default(p, "/protocol", json!("TCP"));
                    let port = p.get("port").cloned().unwrap_or(Value::Null);
                    set_default(p, "/targetPort", port);
                }
            }
            obj["status"] = json!({"loadBalancer": {}});
        }
        ("", "secrets") => set_default(obj, "/type", json!("Opaque")),
        ("apps", "deployments") => {
            set_default(obj, "/spec/replicas", json!(1));
            set_default(obj, "/spec/revisionHistoryLimit", json!(10));
            set_default(obj, "/spec/progressDeadlineSeconds", json!(600));
            // kubectl create sends `strategy: {}`: defaulted field by field, as the real server.
            set_default(obj, "/spec/strategy/type", json!("RollingUpdate"));
            if obj.pointer("/spec/strategy/type") == Some(&json!("RollingUpdate")) {
                set_default(obj, "/spec/strategy/rollingUpdate/maxSurge", json!("25%"));
                set_default(
                    obj,
                    "/spec/strategy/rollingUpdate/maxUnavailable",
                    json!("25%"),
                );
            }
            pod_spec_defaults(obj, "/spec/template", false);
            wl(obj);
        }
        ("apps", "replicasets") => {
            set_default(obj, "/spec/replicas", json!(1));
            pod_spec_defaults(obj, "/spec/template", false);
            wl(obj);
        }
        ("apps", "statefulsets") => {
            set_default(obj, "/spec/replicas", json!(1));
            set_default(obj, "/spec/podManagementPolicy", json!("OrderedReady"));
            set_default(
                obj,
                "/spec/updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
            );
            pod_spec_defaults(obj, "/spec/template", false);
            wl(obj);
        }
        ("apps", "daemonsets") => {
            set_default(
                obj,
                "/spec/updateStrategy",
                json!({"type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
            );
            pod_spec_defaults(obj, "/spec/template", false);
            wl(obj);
        }
        ("batch", "jobs") => {
            set_default(obj, "/spec/parallelism", json!(1));
            set_default(obj, "/spec/completions", json!(1));
            set_default(obj, "/spec/backoffLimit", json!(6));
            set_default(obj, "/spec/completionMode", json!("NonIndexed"));
            if obj.pointer("/spec/selector").is_none() {
                obj["spec"]["selector"] =
                    json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
                set_default(obj, "/spec/template/metadata/labels", json!({}));
                if let Some(l) = obj
                    .pointer_mut("/spec/template/metadata/labels")
                    .and_then(Value::as_object_mut)
                {
                    l.insert("batch.kubernetes.io/controller-uid".into(), json!(uid));
                    l.insert("controller-uid".into(), json!(uid));
                    let name = uid.to_string();
                    let _ = name;
                }
            }
            set_default(obj, "/spec/template/spec/restartPolicy", json!("Never"));
            pod_spec_defaults(obj, "/spec/template", false);
            wl(obj);
        }
        ("policy", "poddisruptionbudgets") => wl(obj),
        _ => {}
    }
}

/// Admission checks of built-in kinds; returns `(field, message)` causes.
pub fn validate(ri: &ResourceInfo, obj: &Value, old: Option<&Value>) -> Vec<(String, String)> {
    let mut causes = Vec::new();
    if !ri.builtin {
        return causes;
    }
    match (ri.group.as_str(), ri.plural.as_str()) {
        ("", "pods") => {
            if obj
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
            {
                causes.push(("spec.containers".into(), "Required value".into()));
            }
            if let Some(old) = old {
                check_pod_update(old, obj, &mut causes);
            }
        }
        ("apps", "deployments" | "replicasets" | "statefulsets" | "daemonsets") => {
            let sel = obj.pointer("/spec/selector");
            if sel.is_none() {
                causes.push(("spec.selector".into(), "Required value".into()));
            }
            match LabelSelector::from_object(sel) {
                Ok(s) => {
                    let labels = obj
                        .pointer("/spec/template/metadata/labels")
                        .and_then(Value::as_object);
                    if sel.is_some() && !s.matches(labels) {
                        causes.push((
                            "spec.template.metadata.labels".into(),
                            "Invalid value: `selector` does not match template `labels`".into(),
                        ));
                    }
                }
                Err(e) => causes.push(("spec.selector".into(), e.to_string())),
            }
            if let Some(old) = old
                && ri.plural != "daemonsets"
                && old.pointer("/spec/selector") != obj.pointer("/spec/selector")
            {
                causes.push((
                    "spec.selector".into(),
                    "Invalid value: field is immutable".into(),
                ));
            }
        }
        _ => {}
    }
    causes
}

/// Pod spec fields that may change after creation; the scheduling directives only while gated.
fn check_pod_update(old: &Value, new: &Value, causes: &mut Vec<(String, String)>) {
    let gated = old
        .pointer("/spec/schedulingGates")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let strip = |v: &Value| -> Value {
        let mut s = v.get("spec").cloned().unwrap_or(json!({}));
        if let Some(m) = s.as_object_mut() {
            for k in ["activeDeadlineSeconds", "tolerations", "schedulingGates"] {
                m.remove(k);
            }
            if gated {
                m.remove("nodeSelector");
                m.remove("affinity");
            }
            if let Some(cs) = m.get_mut("containers").and_then(Value::as_array_mut) {
                for c in cs {
                    if let Some(c) = c.as_object_mut() {
                        c.remove("image");
                    }
                }
            }
        }
        s
    };
    if strip(old) != strip(new) {
        causes.push(("spec".into(), "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), `spec.schedulingGates` (only removals) and, while gated, `spec.nodeSelector` and `spec.affinity`".into()));
    }
    let gates = |v: &Value| {
        v.pointer("/spec/schedulingGates")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (og, ng) = (gates(old), gates(new));
    if ng.iter().any(|g| !og.contains(g)) {
        causes.push((
            "spec.schedulingGates".into(),
            "Forbidden: only deletion is allowed".into(),
        ));
    }
}
