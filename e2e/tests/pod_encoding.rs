//! The pod cache read in protobuf (`--pod-encoding protobuf`) holds the same pods as read in
//! JSON (kube-runtime's watcher, `--pod-encoding json`): pods carrying every field the cache
//! keeps are listed (paged and streamed) and watched (an update, a deletion that waits on a
//! finalizer, the deletion) through both, and every cached pod compared. On the real control
//! plane the protobuf path must have decoded protobuf; ebb-sim answers JSON, which the
//! protobuf path falls back to.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ebb_controller::cluster::CachedPod;
use ebb_controller::state::lists::InitialList;
use ebb_controller::state::pod_stream::{self, Decoded};
use ebb_e2e::SimConfig;
use ebb_e2e::harness::{Backend, TestEnv};
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};

const NS: &str = "pod-encoding";
const NODE: &str = "kwok-node-0";

type Events = std::pin::Pin<Box<dyn Stream<Item = Result<Event<CachedPod>, String>> + Send>>;

/// The protobuf path: ebb's pod watcher.
fn protobuf(client: &kube::Client, lists: InitialList, decoded: Arc<Decoded>) -> Events {
    pod_stream::watch(client.clone(), lists, decoded)
        .map_err(|e| e.to_string())
        .boxed()
}

/// The JSON path: kube-runtime's watcher, as the other caches.
fn json_path(client: &kube::Client, lists: InitialList) -> Events {
    watcher::watcher(Api::<CachedPod>::all(client.clone()), lists.config())
        .map_err(|e| e.to_string())
        .boxed()
}

/// A pod as the cache stores it (the reflector trims every event's pod).
fn kept(mut p: CachedPod) -> CachedPod {
    p.trim();
    p
}

fn ours(p: &CachedPod) -> bool {
    p.metadata.namespace.as_deref() == Some(NS)
}

/// The pods of [`NS`] the initial list (or initial events) holds.
async fn initial(events: &mut Events) -> BTreeMap<String, CachedPod> {
    let mut pods = BTreeMap::new();
    loop {
        let item = tokio::time::timeout(Duration::from_secs(60), events.next())
            .await
            .expect("the initial list within 60 s")
            .expect("the watcher goes on");
        match item {
            Ok(Event::InitApply(p)) if ours(&p) => {
                pods.insert(p.metadata.name.clone().unwrap_or_default(), kept(p));
            }
            Ok(Event::InitDone) => return pods,
            Ok(_) => {}
            Err(e) => panic!("the initial list failed: {e}"),
        }
    }
}

/// The next event about a pod of [`NS`]: `("apply" | "delete", pod)`.
async fn next_of_ours(events: &mut Events) -> (&'static str, CachedPod) {
    loop {
        let item = tokio::time::timeout(Duration::from_secs(60), events.next())
            .await
            .expect("a watch event within 60 s")
            .expect("the watcher goes on");
        match item {
            Ok(Event::Apply(p)) if ours(&p) => return ("apply", kept(p)),
            Ok(Event::Delete(p)) if ours(&p) => return ("delete", kept(p)),
            Ok(_) => {}
            Err(e) => panic!("the watch failed: {e}"),
        }
    }
}

fn time(offset: i64) -> String {
    jiff::Timestamp::from_second(1_767_323_045 + offset)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// The spec and metadata of a pod with every field the cache keeps (and some it drops).
fn full_pod(name: &str, owner_uid: &str, bound: bool) -> Value {
    let selector = json!({
        "matchLabels": {"app": "db"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]
    });
    let term = json!({
        "labelSelector": selector, "namespaces": [NS], "topologyKey": "kubernetes.io/hostname",
        "namespaceSelector": {}, "matchLabelKeys": ["pod-template-hash"],
        "mismatchLabelKeys": ["other"]
    });
    let node_term = json!({
        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}],
        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]
    });
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NS,
            "labels": {"app": "db", "tier": "a"},
            "annotations": {
                "ebb.dev/placement": "token",
                "ebb.dev/e2e-unmanaged": "true",
                "kubectl.kubernetes.io/last-applied-configuration": "{\"whole\":\"pod\"}"
            },
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                "uid": owner_uid, "controller": true, "blockOwnerDeletion": false}],
            "finalizers": ["ebb.dev/e2e-hold"]
        },
        "spec": {
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0", "readOnly": true}},
                {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                {"name": "host", "hostPath": {"path": "/var/data", "type": "DirectoryOrCreate"}},
                {"name": "config", "configMap": {"name": "cfg"}}
            ],
            "initContainers": [{
                "name": "sidecar", "image": "registry.k8s.io/pause:3.10", "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "50m", "memory": "16Mi"}}
            }, {
                "name": "init", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "10m"}}
            }],
            "containers": [{
                "name": "main", "image": "registry.k8s.io/pause:3.10",
                "env": [{"name": "A", "value": "1"}],
                "ports": [
                    {"name": "http", "hostPort": 8080, "containerPort": 80, "protocol": "TCP", "hostIP": "10.0.0.1"},
                    {"containerPort": 9090}
                ],
                "resources": {"limits": {"cpu": "1", "memory": "128Mi"},
                    "requests": {"cpu": "250m", "memory": "64Mi"}}
            }],
            "terminationGracePeriodSeconds": 45,
            "nodeSelector": {"pool": "general"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [node_term]},
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference": node_term}]
                },
                "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]},
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": term}]
                }
            },
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"},
                {"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 120},
                {"operator": "Exists"}
            ],
            "topologySpreadConstraints": [{
                "maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": selector, "minDomains": 2, "nodeAffinityPolicy": "Honor",
                "nodeTaintsPolicy": "Ignore", "matchLabelKeys": ["pod-template-hash"]
            }],
            "resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "500m", "memory": "256Mi"}}
        }
    });
    if bound {
        p["spec"]["nodeName"] = json!(NODE);
    } else {
        p["spec"]["schedulingGates"] = json!([{"name": "ebb.dev/placement"}]);
    }
    p
}

/// A status with what the cache keeps (phase, reason, nomination for a pod not `bound` (the
/// API server allows none on a bound one), start, the three conditions it reads, terminated
/// containers) and what it drops.
fn full_status(bound: bool) -> Value {
    let condition = |type_: &str, status: &str, reason: Option<&str>, at: i64| {
        let mut c = json!({"type": type_, "status": status, "lastTransitionTime": time(at),
            "message": "a message"});
        if let Some(r) = reason {
            c["reason"] = json!(r);
        }
        c
    };
    let terminated = |name: &str, code: i32, reason: &str, from: i64| {
        json!({
            "name": name, "ready": false, "restartCount": 1,
            "image": "registry.k8s.io/pause:3.10", "imageID": "",
            "state": {"terminated": {"exitCode": code, "reason": reason,
                "startedAt": time(from), "finishedAt": time(from + 30),
                "containerID": "containerd://1"}}
        })
    };
    let mut status = json!({"status": {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "dropped",
        "startTime": time(5),
        "conditions": [
            condition("PodScheduled", "True", None, 1),
            condition("Ready", "False", Some("PodFailed"), 2),
            condition("DisruptionTarget", "True", Some("EvictionByEvictionAPI"), 3),
            condition("ContainersReady", "False", Some("PodFailed"), 4)
        ],
        "containerStatuses": [terminated("main", 137, "OOMKilled", 10)],
        "initContainerStatuses": [
            {
                "name": "sidecar", "ready": true, "restartCount": 0,
                "image": "registry.k8s.io/pause:3.10", "imageID": "", "started": true,
                "state": {"running": {"startedAt": time(6)}}
            },
            terminated("init", 0, "Completed", 7)
        ]
    }});
    if !bound {
        status["status"]["nominatedNodeName"] = json!(NODE);
    }
    status
}

fn pointer<'a>(v: &'a Value, path: &str) -> &'a Value {
    v.pointer(path)
        .unwrap_or_else(|| panic!("{path} missing from {v:#}"))
}

ebb_e2e::on_both_backends! {
    async fn protobuf_and_json_pod_caches_hold_the_same_pods(backend) {
        let env = TestEnv::start_on(backend, SimConfig::api_only(), 1)
            .await
            .expect("cluster starts");
        let c = env.client.clone();
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
        Api::<Namespace>::all(c.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace");
        let owner: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "owner", "namespace": NS}})).unwrap();
        let owner = Api::<ConfigMap>::namespaced(c.clone(), NS)
            .create(&PostParams::default(), &owner)
            .await
            .expect("owner");
        let owner_uid = owner.metadata.uid.clone().unwrap_or_default();
        let pods = Api::<Pod>::namespaced(c.clone(), NS);
        for (name, bound) in [("bound", true), ("gated", false)] {
            let pod: Pod = serde_json::from_value(full_pod(name, &owner_uid, bound)).unwrap();
            pods.create(&PostParams::default(), &pod).await.expect("pod created");
            pods.patch_status(name, &PatchParams::default(), &Patch::Merge(full_status(bound)))
                .await
                .unwrap_or_else(|e| panic!("status of {name}: {e}"));
        }
        // A pod as admission leaves it, with no status of its own.
        let plain: Pod = serde_json::from_value(json!({
            "metadata": {"name": "plain", "namespace": NS},
            "spec": {"schedulingGates": [{"name": "ebb.dev/placement"}],
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &plain).await.expect("plain pod");

        for lists in [InitialList::List, InitialList::Stream] {
            let decoded = Arc::new(Decoded::default());
            let mut pb = protobuf(&c, lists, decoded.clone());
            let mut js = json_path(&c, lists);
            let (from_pb, from_json) = (initial(&mut pb).await, initial(&mut js).await);
            assert_eq!(from_pb.keys().collect::<Vec<_>>(), ["bound", "gated", "plain"], "{lists:?}");
            for (name, p) in &from_pb {
                assert_eq!(Some(p), from_json.get(name), "{lists:?}: pod {name}");
            }
            // Equal, and full: every kept field came through.
            let bound = serde_json::to_value(&from_pb["bound"]).unwrap();
            for (path, want) in [
                ("/metadata/uid", json!(pointer(&bound, "/metadata/uid"))),
                ("/metadata/ownerReferences/0/uid", json!(owner_uid)),
                ("/metadata/ownerReferences/0/blockOwnerDeletion", json!(false)),
                ("/metadata/annotations", json!({"ebb.dev/placement": "token", "ebb.dev/e2e-unmanaged": "true"})),
                ("/spec/nodeName", json!(NODE)),
                ("/spec/terminationGracePeriodSeconds", json!(45)),
                ("/spec/containers/0/ports", json!([{"name": "http", "hostPort": 8080, "containerPort": 80, "protocol": "TCP", "hostIP": "10.0.0.1"}])),
                ("/spec/containers/0/resources/requests/memory", json!("64Mi")),
                ("/spec/initContainers/0/restartPolicy", json!("Always")),
                ("/spec/volumes/0/persistentVolumeClaim/readOnly", json!(true)),
                ("/spec/volumes/1/emptyDir/sizeLimit", json!("1Gi")),
                ("/spec/volumes/2/hostPath/type", json!("DirectoryOrCreate")),
                ("/spec/affinity/podAffinity/requiredDuringSchedulingIgnoredDuringExecution/0/mismatchLabelKeys/0", json!("other")),
                ("/spec/tolerations/1/tolerationSeconds", json!(120)),
                ("/spec/topologySpreadConstraints/0/minDomains", json!(2)),
                ("/spec/resources/limits/memory", json!("1Gi")),
                ("/status/phase", json!("Failed")),
                ("/status/reason", json!("Evicted")),
                ("/status/startTime", json!(time(5))),
                ("/status/conditions/0/lastTransitionTime", json!(time(1))),
                ("/status/conditions/2/reason", json!("EvictionByEvictionAPI")),
                ("/status/containerStatuses/0/state/terminated/exitCode", json!(137)),
                ("/status/initContainerStatuses/0/name", json!("init")),
            ] {
                assert_eq!(pointer(&bound, path), &want, "{lists:?}: {path}");
            }
            assert!(bound.pointer("/metadata/creationTimestamp").is_some_and(Value::is_string));
            let gated = serde_json::to_value(&from_pb["gated"]).unwrap();
            assert_eq!(pointer(&gated, "/spec/schedulingGates/0/name"), &json!("ebb.dev/placement"));
            assert_eq!(pointer(&gated, "/status/nominatedNodeName"), &json!(NODE));

            // Watched: an update, a deletion held by the finalizer, the deletion.
            let label = format!("{lists:?}").to_lowercase();
            pods.patch("gated", &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"step": label}}})))
                .await
                .expect("label");
            let (a, b) = (next_of_ours(&mut pb).await, next_of_ours(&mut js).await);
            assert_eq!(a, b, "{lists:?}: the update");
            assert_eq!(a.1.metadata.labels.as_ref().and_then(|l| l.get("step")), Some(&label));
            if lists == InitialList::Stream {
                pods.delete("bound", &DeleteParams::default()).await.expect("delete");
                let (a, b) = (next_of_ours(&mut pb).await, next_of_ours(&mut js).await);
                assert_eq!(a, b, "{lists:?}: the deletion's start");
                assert!(a.1.metadata.deletion_timestamp.is_some(), "{a:?}");
                pods.patch("bound", &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})))
                    .await
                    .expect("finalizer removed");
                let (a, b) = (next_of_ours(&mut pb).await, next_of_ours(&mut js).await);
                assert_eq!(a, b, "{lists:?}: the deletion");
                assert_eq!(a.0, "delete");
            }

            let types = decoded.content_types();
            match backend {
                Backend::Real => {
                    let want: &[&str] = if lists == InitialList::List {
                        &["application/vnd.kubernetes.protobuf",
                          "application/vnd.kubernetes.protobuf;stream=watch"]
                    } else {
                        &["application/vnd.kubernetes.protobuf;stream=watch"]
                    };
                    assert_eq!(types.iter().map(String::as_str).collect::<Vec<_>>(), want,
                        "{lists:?}: the protobuf path decoded protobuf");
                }
                Backend::Sim => {
                    assert!(types.iter().all(|t| t.starts_with("application/json")),
                        "{lists:?}: ebb-sim answers JSON: {types:?}");
                }
            }
        }
        // The gated pod's finalizer would hold the namespace; the cluster goes with the test.
        let _ = pods.patch("gated", &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await;
    }
}
