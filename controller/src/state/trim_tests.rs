//! Trimmed objects read the same as whole ones: generated pods, nodes and owners carrying every
//! field an API server, a kubelet and `kubectl apply` add give every reader of the caches (the
//! model's build, evictions, budgets, placement's patches and end classification) the same
//! answers trimmed as whole, and the trimmed objects hold only a fraction of the fields.

use std::sync::Arc;

use crate::cluster::CachedPod;
use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, ReplicationController};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::trim::Trim;
use crate::actuation::budget_gate;
use crate::actuation::pods as evict_pods;
use crate::cluster::build::{ClusterObjects, Workload, parse_node, parse_pod};
use crate::cluster::build_snapshot;
use crate::cluster::live_tests::canonical;
use crate::cluster::types::NodeSelectorTerm;
use crate::placement::{RelaxedConstraints, Termination};
use crate::reconcilers::placement::{facts, patch};

fn trimmed<K: Trim + Clone>(o: &K) -> K {
    let mut t = o.clone();
    t.trim();
    t
}

fn container(name: &str, cpu: u8, host_port: bool, sidecar: bool, init: bool) -> Value {
    let mut ports = vec![json!({"containerPort": 8080, "name": "http", "protocol": "TCP"})];
    if host_port {
        ports.push(json!({"containerPort": 9100, "hostPort": 9100, "hostIP": "0.0.0.0", "protocol": "UDP"}));
    }
    let mut c = json!({
        "name": name, "image": "registry.example/app:1.2.3", "imagePullPolicy": "IfNotPresent",
        "command": ["/app"], "args": ["--serve", "--port=8080"],
        "env": [{"name": "MODE", "value": "prod"},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": ports,
        "resources": {"requests": {"cpu": (["100m", "250m", "1", "2"][cpu as usize % 4]), "memory": "128Mi",
                                   "ephemeral-storage": "1Gi", "example.com/gpu": "1"},
                      "limits": {"cpu": "4", "memory": "1Gi"}},
        "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets", "readOnly": true}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
        "readinessProbe": {"tcpSocket": {"port": 8080}},
        "securityContext": {"runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
    });
    if init && sidecar {
        c["restartPolicy"] = json!("Always");
    }
    c
}

fn container_status(name: &str, state: u8, exit: i32, oom: bool) -> Value {
    let st = match state {
        0 => json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}),
        1 => json!({"running": {"startedAt": "2026-11-20T10:00:00Z"}}),
        _ => {
            json!({"terminated": {"exitCode": exit, "reason": if oom { "OOMKilled" } else { "Error" },
            "message": "bye", "signal": 9, "containerID": "containerd://abc",
            "startedAt": "2026-11-20T10:00:00Z", "finishedAt": "2026-11-20T10:05:00Z"}})
        }
    };
    json!({"name": name, "image": "registry.example/app:1.2.3", "imageID": "sha256:abc",
           "containerID": "containerd://abc", "ready": state == 1, "restartCount": 3,
           "started": state == 1, "state": st,
           "lastState": {"terminated": {"exitCode": 1, "startedAt": "2026-11-19T10:00:00Z",
                                        "finishedAt": "2026-11-19T10:01:00Z"}}})
}

/// A pod as an API server serves it, with its kubelet's status, from generated choices.
#[allow(clippy::too_many_arguments)]
fn pod_json(
    i: u8,
    node: Option<u8>,
    (cpu, app, owner): (u8, u8, u8),
    (init, sidecar, host_port): (bool, bool, bool),
    (vols, affinity, spread, gated): (u8, bool, bool, bool),
    (phase, ready, state, exit, oom, reason): (u8, bool, u8, i32, bool, u8),
    (deleting, mirror, nominated, tolerate): (bool, bool, bool, bool),
) -> Value {
    let name = format!("p{i}");
    let app = format!("app{app}");
    let mut annotations = json!({
        "kubectl.kubernetes.io/last-applied-configuration": "{\"apiVersion\":\"v1\",\"kind\":\"Pod\"}",
        "ebb.dev/token": format!("tok{i}"),
        "prometheus.io/scrape": "true",
    });
    if mirror {
        annotations["kubernetes.io/config.mirror"] = json!("hash");
    }
    let owner_kind = ["ReplicaSet", "DaemonSet", "StatefulSet", "Job"][owner as usize % 4];
    let mut containers = vec![container("main", cpu, host_port, false, false)];
    if cpu % 2 == 1 {
        containers.push(container("helper", cpu + 1, false, false, false));
    }
    let mut volumes = vec![
        json!({"name": "kube-api-access", "projected": {"sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}),
        json!({"name": "config", "configMap": {"name": "app-config"}}),
    ];
    match vols {
        1 => volumes.push(json!({"name": "scratch", "emptyDir": {}})),
        2 => volumes.push(json!({"name": "shm", "emptyDir": {"medium": "Memory"}})),
        3 => volumes
            .push(json!({"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}})),
        4 => volumes.push(json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}})),
        _ => {}
    }
    let mut spec = json!({
        "containers": containers, "volumes": volumes,
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30 + i64::from(i),
        "dnsPolicy": "ClusterFirst", "serviceAccountName": "default", "serviceAccount": "default",
        "securityContext": {"fsGroup": 2000}, "schedulerName": "default-scheduler",
        "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority", "priority": 0,
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
        "overhead": {"cpu": "10m"},
    });
    if let Some(n) = node {
        spec["nodeName"] = json!(format!("n{n}"));
    }
    if init {
        spec["initContainers"] = json!([container("setup", cpu, host_port, sidecar, true)]);
    }
    if tolerate {
        if let Some(t) = spec["tolerations"].as_array_mut() {
            t.push(
                json!({"key": "pool", "operator": "Equal", "value": "x", "effect": "NoSchedule"}),
            );
        }
        spec["nodeSelector"] = json!({"pool": "x"});
    }
    if affinity {
        spec["affinity"] = json!({
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "preference": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]}}]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}]}});
    }
    if spread {
        spec["topologySpreadConstraints"] = json!([
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"app": app}}, "matchLabelKeys": ["pod-template-hash"]},
            {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": {"app": app}}}]);
    }
    if gated {
        spec["schedulingGates"] =
            json!([{"name": "ebb.dev/placement"}, {"name": "other.example/gate"}]);
    }
    let phase_name = ["Pending", "Running", "Succeeded", "Failed"][phase as usize % 4];
    let mut status = json!({
        "phase": phase_name, "qosClass": "Burstable", "startTime": "2026-11-20T09:59:00Z",
        "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}], "podIP": "10.1.0.7", "podIPs": [{"ip": "10.1.0.7"}],
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-20T09:59:00Z"},
            {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-20T09:59:00Z"},
            {"type": "Ready", "status": if ready { "True" } else { "False" }, "reason": "ContainersNotReady",
             "message": "containers with unready status: [main]", "lastTransitionTime": "2026-11-20T10:00:00Z",
             "lastProbeTime": null}],
        "containerStatuses": [container_status("main", state, exit, oom)],
    });
    if init {
        status["initContainerStatuses"] = json!([container_status("setup", 2, exit, oom)]);
    }
    match reason {
        1 => {
            status["reason"] = json!("Evicted");
            status["message"] = json!("The node was low on resource: memory.");
        }
        2 => status["reason"] = json!("NodeLost"),
        3 => {
            if let Some(c) = status["conditions"].as_array_mut() {
                c.push(json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                              "message": "Eviction API: evicting", "lastTransitionTime": "2026-11-20T10:04:00Z"}));
            }
        }
        _ => {}
    }
    if nominated {
        status["nominatedNodeName"] = json!("n2");
    }
    let mut meta = json!({
        "name": name, "namespace": "ns", "uid": format!("uid-{i}"), "resourceVersion": "12345",
        "generateName": format!("{app}-"), "creationTimestamp": "2026-11-20T09:59:00Z", "generation": 1,
        "labels": {"app": app, "pod-template-hash": "abc", "role": "r"},
        "annotations": annotations,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner_kind, "name": app, "uid": "owner-uid",
                             "controller": true, "blockOwnerDeletion": true}],
        "finalizers": ["example.com/keep"],
        "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                           "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}],
    });
    if deleting {
        meta["deletionTimestamp"] = json!("2026-11-20T10:06:00Z");
        meta["deletionGracePeriodSeconds"] = json!(30);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status})
}

prop_compose! {
    fn rich_pod_json(i: u8)(
        node in prop::option::weighted(0.8, 0u8..3),
        shape in (0u8..4, 0u8..3, 0u8..4),
        init in (any::<bool>(), any::<bool>(), prop::bool::weighted(0.2)),
        sched in (0u8..6, prop::bool::weighted(0.3), prop::bool::weighted(0.3), prop::bool::weighted(0.2)),
        status in (0u8..4, any::<bool>(), 0u8..3, prop_oneof![Just(0i32), Just(1), Just(137)], any::<bool>(), 0u8..4),
        flags in (prop::bool::weighted(0.1), prop::bool::weighted(0.05), prop::bool::weighted(0.1), any::<bool>()),
    ) -> Value {
        pod_json(i, node, shape, init, sched, status, flags)
    }
}

prop_compose! {
    fn rich_pod(i: u8)(v in rich_pod_json(i)) -> CachedPod {
        serde_json::from_value(v).expect("the generated pod decodes")
    }
}

prop_compose! {
    fn rich_node(i: u8)(
        cpu in 0u8..3,
        ready in prop::bool::weighted(0.9),
        unschedulable in prop::bool::weighted(0.1),
        taint in 0u8..3,
        capi in any::<bool>(),
        deleting in prop::bool::weighted(0.1),
        drained in prop::bool::weighted(0.1),
    ) -> Node {
        let name = format!("n{i}");
        let res = json!({"cpu": (["2", "4", "8"][cpu as usize]), "memory": "16Gi", "pods": "110",
                         "ephemeral-storage": "100Gi", "hugepages-2Mi": "0"});
        let mut labels = json!({"kubernetes.io/hostname": name, "pool": "x",
                                "topology.kubernetes.io/zone": (["a", "b"][i as usize % 2])});
        if drained {
            labels["ebb.dev/drained"] = json!("true");
        }
        let mut annotations = json!({"node.alpha.kubernetes.io/ttl": "0",
            "kubectl.kubernetes.io/last-applied-configuration": "{}"});
        if capi {
            annotations["cluster.x-k8s.io/machine"] = json!(format!("m-{i}"));
            annotations["cluster.x-k8s.io/cluster-namespace"] = json!("capi");
            annotations["cluster.x-k8s.io/owner-kind"] = json!("MachineSet");
            annotations["cluster.x-k8s.io/owner-name"] = json!("ms");
        }
        let taints = match taint {
            1 => json!([{"key": "ebb.dev/deletion-candidate", "effect": "PreferNoSchedule", "timeAdded": "2026-11-20T10:00:00Z"}]),
            2 => json!([{"key": "ebb.dev/to-be-deleted", "value": "1", "effect": "NoSchedule"},
                        {"key": "dedicated", "value": "db", "effect": "NoExecute"}]),
            _ => json!([]),
        };
        let mut meta = json!({"name": name, "uid": format!("node-uid-{i}"), "resourceVersion": "77",
            "creationTimestamp": "2026-11-20T09:00:00Z", "labels": labels, "annotations": annotations,
            "managedFields": [{"manager": "kubelet", "operation": "Update"}]});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-11-20T10:06:00Z");
        }
        let v = json!({"apiVersion": "v1", "kind": "Node", "metadata": meta,
            "spec": {"providerID": format!("kwok://{name}"), "podCIDR": "10.1.0.0/24", "podCIDRs": ["10.1.0.0/24"],
                     "taints": taints, "unschedulable": unschedulable},
            "status": {"capacity": res, "allocatable": res,
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                     "message": "ok", "lastHeartbeatTime": "2026-11-20T10:00:00Z", "lastTransitionTime": "2026-11-20T09:00:00Z"},
                    {"type": "Ready", "status": if ready { "True" } else { "False" }, "reason": "KubeletReady",
                     "message": "kubelet is posting ready status", "lastHeartbeatTime": "2026-11-20T10:00:00Z",
                     "lastTransitionTime": "2026-11-20T09:00:00Z"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "containerd://2",
                    "kernelVersion": "6", "kubeProxyVersion": "", "kubeletVersion": "v1.36.3", "machineID": "m",
                    "operatingSystem": "linux", "osImage": "Debian", "systemUUID": "u"},
                "images": [{"names": ["registry.example/app@sha256:abc", "registry.example/app:1.2.3"], "sizeBytes": 12345678}],
                "volumesInUse": ["kubernetes.io/csi/x"]}});
        serde_json::from_value(v).expect("the generated node is a Node")
    }
}

/// What the pod readers make of a pod, as text.
fn pod_readings(p: &CachedPod) -> Vec<String> {
    let volumes: crate::cluster::build::VolumeIndex = [(
        ("ns".to_string(), "data".to_string()),
        crate::cluster::build::ClaimPlacement::Bound {
            pv: "pv-1".into(),
            terms: vec![NodeSelectorTerm::default()],
        },
    )]
    .into();
    let relaxed = RelaxedConstraints {
        node_selector: [("pool".to_string(), "x".to_string())].into(),
        avoid_nodes: vec!["n1".into()],
        prefer_nodes: vec![("n2".into(), 50)],
    };
    let arc = [Arc::new(p.clone())];
    vec![
        format!("{:?}", parse_pod(p, &volumes, None)),
        format!("{:?}", Termination::from_pod(p, false, false)),
        format!("{:?}", Termination::from_pod(p, true, true)),
        format!(
            "{:?}",
            (0..3)
                .map(|n| evict_pods::classify(&format!("n{n}"), [p]))
                .collect::<Vec<_>>()
        ),
        format!(
            "{:?}",
            (budget_gate::ready(p), budget_gate::ignores_budgets(p))
        ),
        format!("{}", patch::is_gated(p)),
        patch::pin(p, "n1", "tok").to_string(),
        patch::relax(p, &relaxed, "Relaxed", "tok").to_string(),
        format!("{:?}", crate::reconcilers::placement::pass::phase(p)),
        format!("{:?}", crate::reconcilers::placement::pass::node_of(p)),
        format!("{:?}", facts_selected(&arc)),
    ]
}

/// Which pods a PlacementHistory of namespace `ns` selecting `app: app0` takes, with roles.
fn facts_selected(pods: &[Arc<CachedPod>]) -> Vec<(String, String)> {
    let ph: ebb_api::placement::PlacementHistory = serde_json::from_value(json!({
        "apiVersion": "ebb.dev/v1alpha1", "kind": "PlacementHistory",
        "metadata": {"name": "h", "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"app": "app0"}}, "roleLabel": "role",
                 "roles": [{"name": "r"}]}}))
    .expect("a PlacementHistory");
    facts::selected(&ph, pods)
        .map(|s| {
            s.into_iter()
                .map(|(p, r)| (p.metadata.name.clone().unwrap_or_default(), r))
                .collect()
        })
        .unwrap_or_default()
}

fn node_readings(n: &Node) -> Vec<String> {
    vec![
        format!("{:?}", parse_node(n)),
        format!("{:?}", facts::view(n)),
        format!("{}", facts::is_ready(n)),
        format!("{}", super::stores::node_fingerprint(n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn a_trimmed_pod_reads_the_same(p in rich_pod(0)) {
        let t = trimmed(&p);
        prop_assert_eq!(pod_readings(&p), pod_readings(&t));
        prop_assert!(t.metadata.managed_fields.is_none());
        prop_assert!(t.metadata.annotations.as_ref().is_some_and(|a| !a.contains_key("kubectl.kubernetes.io/last-applied-configuration")));
    }

    /// The cache decodes pods straight into `CachedPod` by the API's field names; the typed
    /// conversion from a whole `Pod` is checked by the compiler. Both must keep the same: a
    /// misspelt field name would decode as absent.
    #[test]
    fn a_decoded_pod_is_the_whole_pod_cut_down(i in 0u8..6, v in rich_pod_json(0)) {
        let whole: Pod = serde_json::from_value(v.clone()).expect("the generated pod is a Pod");
        let mut decoded: CachedPod = serde_json::from_value(v.clone()).expect("the generated pod decodes");
        decoded.trim();
        let typed = CachedPod::from(whole);
        prop_assert_eq!(&decoded, &typed, "pod {}", i);
        // What the cache holds is well under the object the API sends (the generated pods are
        // small; real ones, with their managed fields and status, lose far more).
        let (all, kept) = (v.to_string().len(), serde_json::to_string(&decoded).unwrap_or_default().len());
        prop_assert!(kept * 5 < all * 3, "kept {} of {} bytes", kept, all);
        // Every field a reader uses survived: the node, requests, owners, phase.
        prop_assert_eq!(decoded.node_name(), v["spec"]["nodeName"].as_str());
        prop_assert_eq!(decoded.phase(), v["status"]["phase"].as_str());
        prop_assert_eq!(
            decoded.spec.as_ref().map(|s| s.containers.len()),
            v["spec"]["containers"].as_array().map(Vec::len)
        );
        prop_assert_eq!(
            decoded.metadata.owner_references.as_ref().map(Vec::len),
            v["metadata"]["ownerReferences"].as_array().map(Vec::len)
        );
    }

    #[test]
    fn a_trimmed_node_reads_the_same(n in rich_node(0)) {
        let t = trimmed(&n);
        prop_assert_eq!(node_readings(&n), node_readings(&t));
        prop_assert!(t.status.as_ref().is_some_and(|s| s.images.is_none() && s.node_info.is_none()));
    }

    /// The model built from trimmed caches equals the one built from whole objects.
    #[test]
    fn a_snapshot_of_trimmed_objects_is_the_same(
        nodes in (rich_node(0), rich_node(1), rich_node(2)),
        pods in (rich_pod(0), rich_pod(1), rich_pod(2), rich_pod(3), rich_pod(4), rich_pod(5)),
        replicas in (0i32..5, 0i32..5),
    ) {
        let whole = ClusterObjects {
            nodes: vec![nodes.0, nodes.1, nodes.2],
            pods: vec![pods.0, pods.1, pods.2, pods.3, pods.4, pods.5],
            replica_sets: (0..3).map(|a| owner::<ReplicaSet>(a, replicas.0)).collect(),
            stateful_sets: (0..3).map(|a| owner::<StatefulSet>(a, replicas.1)).collect(),
            daemon_sets: (0..3).map(|a| owner::<DaemonSet>(a, replicas.0)).collect(),
            jobs: (0..3).map(|a| owner::<Job>(a, replicas.1)).collect(),
            replication_controllers: vec![owner::<ReplicationController>(0, replicas.0)],
            ..ClusterObjects::default()
        };
        let cut = ClusterObjects {
            nodes: whole.nodes.iter().map(trimmed).collect(),
            pods: whole.pods.iter().map(trimmed).collect(),
            replica_sets: whole.replica_sets.iter().map(trimmed).collect(),
            stateful_sets: whole.stateful_sets.iter().map(trimmed).collect(),
            daemon_sets: whole.daemon_sets.iter().map(trimmed).collect(),
            jobs: whole.jobs.iter().map(trimmed).collect(),
            replication_controllers: whole.replication_controllers.iter().map(trimmed).collect(),
            ..ClusterObjects::default()
        };
        let owners = |o: &ClusterObjects| {
            let mut v: Vec<String> = o.replica_sets.iter().map(|x| format!("{:?}", x.owner_info()))
                .chain(o.stateful_sets.iter().map(|x| format!("{:?}", x.owner_info())))
                .chain(o.daemon_sets.iter().map(|x| format!("{:?}", x.owner_info())))
                .chain(o.jobs.iter().map(|x| format!("{:?}", x.owner_info())))
                .chain(o.replication_controllers.iter().map(|x| format!("{:?}", x.owner_info())))
                .collect();
            v.sort();
            v
        };
        prop_assert_eq!(owners(&whole), owners(&cut));
        match (build_snapshot(&whole), build_snapshot(&cut)) {
            (Ok(a), Ok(b)) => prop_assert_eq!(canonical(&a), canonical(&b)),
            (a, b) => prop_assert_eq!(a.err(), b.err()),
        }
    }
}

/// A workload owner of pods `app<a>` as an API server serves it (template, status and all).
fn owner<K: serde::de::DeserializeOwned>(a: u8, replicas: i32) -> K {
    let kind = std::any::type_name::<K>()
        .rsplit("::")
        .next()
        .unwrap_or_default()
        .to_string();
    let api_version = match kind.as_str() {
        "Job" => "batch/v1",
        "ReplicationController" => "v1",
        _ => "apps/v1",
    };
    let template = json!({"metadata": {"labels": {"app": format!("app{a}")}},
        "spec": {"containers": [container("main", 1, false, false, false)]}});
    let selector = if kind == "ReplicationController" {
        json!({"app": format!("app{a}")})
    } else {
        json!({"matchLabels": {"app": format!("app{a}")}})
    };
    let mut spec = json!({"selector": selector, "template": template});
    match kind.as_str() {
        "Job" => spec["parallelism"] = json!(replicas),
        "DaemonSet" => {}
        _ => spec["replicas"] = json!(replicas),
    }
    let v = json!({"apiVersion": api_version, "kind": kind,
        "metadata": {"name": format!("app{a}"), "namespace": "ns", "uid": format!("owner-{a}"),
                     "labels": {"app": format!("app{a}")}, "generation": 3,
                     "annotations": {"deployment.kubernetes.io/revision": "4",
                                     "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": format!("app{a}"),
                                          "uid": "d", "controller": true}]},
        "spec": spec,
        "status": {"replicas": replicas, "readyReplicas": replicas, "observedGeneration": 3,
                   "currentNumberScheduled": replicas, "numberMisscheduled": 0,
                   "desiredNumberScheduled": replicas + 1, "numberReady": replicas}});
    serde_json::from_value(v).expect("a generated owner")
}
