//! A protobuf pod converts to the [`CachedPod`] the JSON decode keeps of the same pod: every
//! kept field set (and some dropped ones), compared field by field with the JSON the API server
//! writes for it; the encodings' ways of saying "unset" (empty strings, zeros, empty times).

use std::collections::BTreeMap;

use k8s_pb::api::core::v1 as pb;
use k8s_pb::apimachinery::pkg::api::resource::Quantity as PbQuantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pmeta;
use serde_json::json;

use super::CachedPod;
use super::cached_pod_pb::ConvertError;

fn s(v: &str) -> Option<String> {
    Some(v.to_string())
}

fn q(v: &str) -> PbQuantity {
    PbQuantity { string: s(v) }
}

fn qs(pairs: &[(&str, &str)]) -> BTreeMap<String, PbQuantity> {
    pairs.iter().map(|(k, v)| (k.to_string(), q(v))).collect()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Go's protobuf time: whole seconds (nanos, which Go never sends, are dropped if present).
fn t(seconds: i64) -> Option<pmeta::Time> {
    Some(pmeta::Time {
        seconds: Some(seconds),
        nanos: Some(0),
    })
}

/// 2026-01-02T03:04:05Z
const T0: i64 = 1_767_323_045;

fn selector() -> pmeta::LabelSelector {
    pmeta::LabelSelector {
        match_labels: map(&[("app", "db")]),
        match_expressions: vec![pmeta::LabelSelectorRequirement {
            key: s("tier"),
            operator: s("In"),
            values: vec!["a".into(), "b".into()],
        }],
    }
}

fn term() -> pb::PodAffinityTerm {
    pb::PodAffinityTerm {
        label_selector: Some(selector()),
        namespaces: vec!["ns1".into()],
        topology_key: s("kubernetes.io/hostname"),
        namespace_selector: Some(pmeta::LabelSelector::default()),
        match_label_keys: vec!["pod-template-hash".into()],
        mismatch_label_keys: vec!["other".into()],
    }
}

fn node_term() -> pb::NodeSelectorTerm {
    pb::NodeSelectorTerm {
        match_expressions: vec![pb::NodeSelectorRequirement {
            key: s("zone"),
            operator: s("In"),
            values: vec!["z1".into()],
        }],
        match_fields: vec![pb::NodeSelectorRequirement {
            key: s("metadata.name"),
            operator: s("NotIn"),
            values: vec!["n9".into()],
        }],
    }
}

/// A container as Go writes it: every non-pointer field present, empty or not.
fn container(name: &str, restart: Option<&str>) -> pb::Container {
    pb::Container {
        name: s(name),
        image: s("registry/app:1"),
        env: vec![pb::EnvVar {
            name: s("A"),
            value: s("1"),
            ..Default::default()
        }],
        ports: vec![
            pb::ContainerPort {
                name: s("http"),
                host_port: Some(8080),
                container_port: Some(80),
                protocol: s("TCP"),
                host_ip: s("10.0.0.1"),
            },
            // No hostPort: dropped by trim.
            pb::ContainerPort {
                name: s(""),
                host_port: Some(0),
                container_port: Some(9090),
                protocol: s("TCP"),
                host_ip: s(""),
            },
        ],
        resources: Some(pb::ResourceRequirements {
            limits: qs(&[("cpu", "1")]),
            requests: qs(&[("cpu", "250m"), ("memory", "64Mi")]),
            claims: vec![],
        }),
        restart_policy: restart.map(str::to_string),
        termination_message_path: s("/dev/termination-log"),
        ..Default::default()
    }
}

fn condition(type_: &str, status: &str, reason: &str, at: i64) -> pb::PodCondition {
    pb::PodCondition {
        r#type: s(type_),
        status: s(status),
        reason: s(reason),
        message: s("a message"),
        last_probe_time: Some(pmeta::Time::default()),
        last_transition_time: t(at),
        ..Default::default()
    }
}

/// A pod with every field the cache keeps set, some it drops, and empty values where Go writes
/// them.
pub(crate) fn full_pod() -> pb::Pod {
    pb::Pod {
        metadata: Some(pmeta::ObjectMeta {
            name: s("db-0"),
            generate_name: s("db-"),
            namespace: s("shop"),
            uid: s("0b5c-uid"),
            resource_version: s("4711"),
            generation: Some(3),
            creation_timestamp: t(T0),
            deletion_timestamp: t(T0 + 60),
            deletion_grace_period_seconds: Some(30),
            labels: map(&[("app", "db"), ("tier", "a")]),
            annotations: map(&[
                ("ebb.dev/placement", "token"),
                (
                    "kubectl.kubernetes.io/last-applied-configuration",
                    "{\"whole\":\"pod\"}",
                ),
            ]),
            owner_references: vec![pmeta::OwnerReference {
                api_version: s("apps/v1"),
                kind: s("StatefulSet"),
                name: s("db"),
                uid: s("owner-uid"),
                controller: Some(true),
                block_owner_deletion: Some(false),
            }],
            finalizers: vec!["f".into()],
            managed_fields: vec![pmeta::ManagedFieldsEntry {
                manager: s("kubectl"),
                ..Default::default()
            }],
            ..Default::default()
        }),
        spec: Some(pb::PodSpec {
            volumes: vec![
                pb::Volume {
                    name: s("data"),
                    volume_source: Some(pb::VolumeSource {
                        persistent_volume_claim: Some(pb::PersistentVolumeClaimVolumeSource {
                            claim_name: s("data-db-0"),
                            read_only: Some(true),
                        }),
                        ..Default::default()
                    }),
                },
                pb::Volume {
                    name: s("scratch"),
                    volume_source: Some(pb::VolumeSource {
                        empty_dir: Some(pb::EmptyDirVolumeSource {
                            medium: s("Memory"),
                            size_limit: Some(q("1Gi")),
                        }),
                        ..Default::default()
                    }),
                },
                pb::Volume {
                    name: s("host"),
                    volume_source: Some(pb::VolumeSource {
                        host_path: Some(pb::HostPathVolumeSource {
                            path: s("/var/data"),
                            r#type: s("Directory"),
                        }),
                        ..Default::default()
                    }),
                },
                // A kind no reader looks at: dropped.
                pb::Volume {
                    name: s("config"),
                    volume_source: Some(pb::VolumeSource {
                        config_map: Some(pb::ConfigMapVolumeSource {
                            local_object_reference: Some(pb::LocalObjectReference {
                                name: s("cfg"),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                },
            ],
            init_containers: vec![container("sidecar", Some("Always"))],
            containers: vec![container("main", None)],
            restart_policy: s("Always"),
            termination_grace_period_seconds: Some(45),
            node_selector: map(&[("pool", "general")]),
            service_account_name: s("default"),
            node_name: s("node-1"),
            affinity: Some(pb::Affinity {
                node_affinity: Some(pb::NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(pb::NodeSelector {
                        node_selector_terms: vec![node_term()],
                    }),
                    preferred_during_scheduling_ignored_during_execution: vec![
                        pb::PreferredSchedulingTerm {
                            weight: Some(10),
                            preference: Some(node_term()),
                        },
                    ],
                }),
                pod_affinity: Some(pb::PodAffinity {
                    required_during_scheduling_ignored_during_execution: vec![term()],
                    preferred_during_scheduling_ignored_during_execution: vec![],
                }),
                pod_anti_affinity: Some(pb::PodAntiAffinity {
                    required_during_scheduling_ignored_during_execution: vec![],
                    preferred_during_scheduling_ignored_during_execution: vec![
                        pb::WeightedPodAffinityTerm {
                            weight: Some(50),
                            pod_affinity_term: Some(term()),
                        },
                    ],
                }),
            }),
            scheduler_name: s("default-scheduler"),
            tolerations: vec![
                pb::Toleration {
                    key: s("node.kubernetes.io/not-ready"),
                    operator: s("Exists"),
                    value: s(""),
                    effect: s("NoExecute"),
                    toleration_seconds: Some(300),
                },
                pb::Toleration {
                    key: s("dedicated"),
                    operator: s("Equal"),
                    value: s("db"),
                    effect: s(""),
                    toleration_seconds: None,
                },
            ],
            priority_class_name: s(""),
            overhead: qs(&[("cpu", "10m")]),
            topology_spread_constraints: vec![pb::TopologySpreadConstraint {
                max_skew: Some(1),
                topology_key: s("zone"),
                when_unsatisfiable: s("DoNotSchedule"),
                label_selector: Some(selector()),
                min_domains: Some(2),
                node_affinity_policy: s("Honor"),
                node_taints_policy: s("Ignore"),
                match_label_keys: vec!["pod-template-hash".into()],
            }],
            scheduling_gates: vec![pb::PodSchedulingGate {
                name: s("ebb.dev/placement"),
            }],
            resources: Some(pb::ResourceRequirements {
                limits: qs(&[("memory", "1Gi")]),
                requests: qs(&[("cpu", "500m")]),
                claims: vec![pb::ResourceClaim {
                    name: s("gpu"),
                    request: s(""),
                }],
            }),
            ..Default::default()
        }),
        status: Some(pb::PodStatus {
            phase: s("Failed"),
            conditions: vec![
                condition("PodScheduled", "True", "", T0 + 1),
                condition("Ready", "False", "PodFailed", T0 + 2),
                condition("DisruptionTarget", "True", "EvictionByEvictionAPI", T0 + 3),
                // Not read: dropped.
                condition("ContainersReady", "False", "PodFailed", T0 + 4),
            ],
            message: s("dropped"),
            reason: s("Evicted"),
            nominated_node_name: s("node-2"),
            host_ip: s("10.0.0.1"),
            pod_ip: s("10.1.0.7"),
            start_time: t(T0 + 5),
            container_statuses: vec![
                pb::ContainerStatus {
                    name: s("main"),
                    state: Some(pb::ContainerState {
                        terminated: Some(pb::ContainerStateTerminated {
                            exit_code: Some(137),
                            signal: Some(0),
                            reason: s("OOMKilled"),
                            message: s(""),
                            started_at: t(T0 + 6),
                            finished_at: t(T0 + 7),
                            container_id: s("containerd://1"),
                        }),
                        ..Default::default()
                    }),
                    last_state: Some(pb::ContainerState::default()),
                    ready: Some(false),
                    restart_count: Some(2),
                    image: s("registry/app:1"),
                    image_id: s("sha256:1"),
                    ..Default::default()
                },
                // Running: dropped.
                pb::ContainerStatus {
                    name: s("other"),
                    state: Some(pb::ContainerState {
                        running: Some(pb::ContainerStateRunning {
                            started_at: t(T0 + 8),
                        }),
                        ..Default::default()
                    }),
                    ready: Some(true),
                    ..Default::default()
                },
            ],
            init_container_statuses: vec![pb::ContainerStatus {
                name: s("sidecar"),
                state: Some(pb::ContainerState {
                    terminated: Some(pb::ContainerStateTerminated {
                        exit_code: Some(0),
                        reason: s("Completed"),
                        started_at: Some(pmeta::Time::default()),
                        finished_at: t(T0 + 9),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ready: Some(true),
                ..Default::default()
            }],
            ..Default::default()
        }),
    }
}

/// [`full_pod`] as kube-apiserver writes it in JSON (Go's `omitempty`: empty strings and zeros
/// left out; structs always written; zero times `null`).
pub(crate) fn full_pod_json() -> serde_json::Value {
    let selector = json!({
        "matchLabels": {"app": "db"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]
    });
    let term = json!({
        "labelSelector": selector,
        "namespaces": ["ns1"],
        "topologyKey": "kubernetes.io/hostname",
        "namespaceSelector": {},
        "matchLabelKeys": ["pod-template-hash"],
        "mismatchLabelKeys": ["other"]
    });
    let node_term = json!({
        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}],
        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]
    });
    let container = |name: &str, restart: Option<&str>| {
        let mut c = json!({
            "name": name,
            "image": "registry/app:1",
            "env": [{"name": "A", "value": "1"}],
            "ports": [
                {"name": "http", "hostPort": 8080, "containerPort": 80, "protocol": "TCP", "hostIP": "10.0.0.1"},
                {"containerPort": 9090, "protocol": "TCP"}
            ],
            "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "250m", "memory": "64Mi"}},
            "terminationMessagePath": "/dev/termination-log"
        });
        if let Some(r) = restart {
            c["restartPolicy"] = json!(r);
        }
        c
    };
    let condition = |type_: &str, status: &str, reason: Option<&str>, at: &str| {
        let mut c = json!({
            "type": type_, "status": status, "lastProbeTime": null,
            "lastTransitionTime": at, "message": "a message"
        });
        if let Some(r) = reason {
            c["reason"] = json!(r);
        }
        c
    };
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "db-0",
            "generateName": "db-",
            "namespace": "shop",
            "uid": "0b5c-uid",
            "resourceVersion": "4711",
            "generation": 3,
            "creationTimestamp": "2026-01-02T03:04:05Z",
            "deletionTimestamp": "2026-01-02T03:05:05Z",
            "deletionGracePeriodSeconds": 30,
            "labels": {"app": "db", "tier": "a"},
            "annotations": {
                "ebb.dev/placement": "token",
                "kubectl.kubernetes.io/last-applied-configuration": "{\"whole\":\"pod\"}"
            },
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "owner-uid",
                "controller": true, "blockOwnerDeletion": false
            }],
            "finalizers": ["f"],
            "managedFields": [{"manager": "kubectl"}]
        },
        "spec": {
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0", "readOnly": true}},
                {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                {"name": "host", "hostPath": {"path": "/var/data", "type": "Directory"}},
                {"name": "config", "configMap": {"name": "cfg"}}
            ],
            "initContainers": [container("sidecar", Some("Always"))],
            "containers": [container("main", None)],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 45,
            "nodeSelector": {"pool": "general"},
            "serviceAccountName": "default",
            "nodeName": "node-1",
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
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "dedicated", "operator": "Equal", "value": "db"}
            ],
            "overhead": {"cpu": "10m"},
            "topologySpreadConstraints": [{
                "maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": selector, "minDomains": 2, "nodeAffinityPolicy": "Honor",
                "nodeTaintsPolicy": "Ignore", "matchLabelKeys": ["pod-template-hash"]
            }],
            "schedulingGates": [{"name": "ebb.dev/placement"}],
            "resources": {
                "limits": {"memory": "1Gi"},
                "requests": {"cpu": "500m"},
                "claims": [{"name": "gpu"}]
            }
        },
        "status": {
            "phase": "Failed",
            "conditions": [
                condition("PodScheduled", "True", None, "2026-01-02T03:04:06Z"),
                condition("Ready", "False", Some("PodFailed"), "2026-01-02T03:04:07Z"),
                condition("DisruptionTarget", "True", Some("EvictionByEvictionAPI"), "2026-01-02T03:04:08Z"),
                condition("ContainersReady", "False", Some("PodFailed"), "2026-01-02T03:04:09Z")
            ],
            "message": "dropped",
            "reason": "Evicted",
            "nominatedNodeName": "node-2",
            "hostIP": "10.0.0.1",
            "podIP": "10.1.0.7",
            "startTime": "2026-01-02T03:04:10Z",
            "containerStatuses": [
                {
                    "name": "main",
                    "state": {"terminated": {
                        "exitCode": 137, "reason": "OOMKilled",
                        "startedAt": "2026-01-02T03:04:11Z", "finishedAt": "2026-01-02T03:04:12Z",
                        "containerID": "containerd://1"
                    }},
                    "lastState": {},
                    "ready": false, "restartCount": 2, "image": "registry/app:1", "imageID": "sha256:1"
                },
                {
                    "name": "other",
                    "state": {"running": {"startedAt": "2026-01-02T03:04:13Z"}},
                    "lastState": {},
                    "ready": true, "restartCount": 0, "image": "", "imageID": ""
                }
            ],
            "initContainerStatuses": [{
                "name": "sidecar",
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": null,
                    "finishedAt": "2026-01-02T03:04:14Z"}},
                "lastState": {},
                "ready": true, "restartCount": 0, "image": "", "imageID": ""
            }]
        }
    })
}

/// What the JSON path keeps: decode into [`CachedPod`], then trim (the watch's `modify`).
fn from_json(v: serde_json::Value) -> CachedPod {
    let mut p: CachedPod = serde_json::from_value(v).expect("the JSON pod decodes");
    p.trim();
    p
}

#[test]
fn every_kept_field_matches_the_json_decode() {
    let got = CachedPod::from_protobuf(full_pod()).expect("converts");
    let want = from_json(full_pod_json());
    // Field by field first, for a readable failure.
    assert_eq!(got.metadata, want.metadata, "metadata");
    let (gs, ws) = (got.spec.clone().unwrap(), want.spec.clone().unwrap());
    assert_eq!(gs.node_name, ws.node_name, "nodeName");
    assert_eq!(gs.containers, ws.containers, "containers");
    assert_eq!(gs.init_containers, ws.init_containers, "initContainers");
    assert_eq!(gs.volumes, ws.volumes, "volumes");
    assert_eq!(gs.affinity, ws.affinity, "affinity");
    assert_eq!(gs.node_selector, ws.node_selector, "nodeSelector");
    assert_eq!(gs.tolerations, ws.tolerations, "tolerations");
    assert_eq!(
        gs.topology_spread_constraints, ws.topology_spread_constraints,
        "topologySpreadConstraints"
    );
    assert_eq!(gs.scheduling_gates, ws.scheduling_gates, "schedulingGates");
    assert_eq!(gs.overhead, ws.overhead, "overhead");
    assert_eq!(gs.resources, ws.resources, "resources");
    assert_eq!(
        gs.termination_grace_period_seconds, ws.termination_grace_period_seconds,
        "terminationGracePeriodSeconds"
    );
    let (gt, wt) = (got.status.clone().unwrap(), want.status.clone().unwrap());
    assert_eq!(gt.phase, wt.phase, "phase");
    assert_eq!(gt.reason, wt.reason, "reason");
    assert_eq!(
        gt.nominated_node_name, wt.nominated_node_name,
        "nominatedNodeName"
    );
    assert_eq!(gt.start_time, wt.start_time, "startTime");
    assert_eq!(gt.conditions, wt.conditions, "conditions");
    assert_eq!(
        gt.container_statuses, wt.container_statuses,
        "containerStatuses"
    );
    assert_eq!(
        gt.init_container_statuses, wt.init_container_statuses,
        "initContainerStatuses"
    );
    assert_eq!(got, want);
}

/// The comparison above proves nothing for a field both sides lost: every kept field must be
/// there, with its value, in what the protobuf path keeps.
#[test]
fn every_kept_field_is_kept() {
    let got = CachedPod::from_protobuf(full_pod()).expect("converts");
    let v = serde_json::to_value(&got).expect("serializes");
    let kept = [
        ("/metadata/name", json!("db-0")),
        ("/metadata/namespace", json!("shop")),
        ("/metadata/uid", json!("0b5c-uid")),
        ("/metadata/resourceVersion", json!("4711")),
        ("/metadata/labels/tier", json!("a")),
        (
            "/metadata/annotations",
            json!({"ebb.dev/placement": "token"}),
        ),
        ("/metadata/ownerReferences/0/controller", json!(true)),
        (
            "/metadata/ownerReferences/0/blockOwnerDeletion",
            json!(false),
        ),
        ("/metadata/ownerReferences/0/uid", json!("owner-uid")),
        ("/metadata/creationTimestamp", json!("2026-01-02T03:04:05Z")),
        ("/metadata/deletionTimestamp", json!("2026-01-02T03:05:05Z")),
        ("/spec/nodeName", json!("node-1")),
        ("/spec/nodeSelector/pool", json!("general")),
        ("/spec/terminationGracePeriodSeconds", json!(45)),
        ("/spec/containers/0/name", json!("main")),
        (
            "/spec/containers/0/resources/requests/memory",
            json!("64Mi"),
        ),
        (
            "/spec/containers/0/ports",
            json!([{"name": "http", "hostPort": 8080, "containerPort": 80, "protocol": "TCP", "hostIP": "10.0.0.1"}]),
        ),
        ("/spec/initContainers/0/restartPolicy", json!("Always")),
        (
            "/spec/volumes/0/persistentVolumeClaim",
            json!({"claimName": "data-db-0", "readOnly": true}),
        ),
        (
            "/spec/volumes/1/emptyDir",
            json!({"medium": "Memory", "sizeLimit": "1Gi"}),
        ),
        (
            "/spec/volumes/2/hostPath",
            json!({"path": "/var/data", "type": "Directory"}),
        ),
        (
            "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0/values/0",
            json!("n9"),
        ),
        (
            "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/weight",
            json!(10),
        ),
        (
            "/spec/affinity/podAffinity/requiredDuringSchedulingIgnoredDuringExecution/0/mismatchLabelKeys/0",
            json!("other"),
        ),
        (
            "/spec/affinity/podAffinity/requiredDuringSchedulingIgnoredDuringExecution/0/namespaceSelector",
            json!({}),
        ),
        (
            "/spec/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/podAffinityTerm/labelSelector/matchExpressions/0/values/1",
            json!("b"),
        ),
        (
            "/spec/tolerations/0",
            json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}),
        ),
        (
            "/spec/tolerations/1",
            json!({"key": "dedicated", "operator": "Equal", "value": "db"}),
        ),
        ("/spec/topologySpreadConstraints/0/minDomains", json!(2)),
        (
            "/spec/topologySpreadConstraints/0/nodeTaintsPolicy",
            json!("Ignore"),
        ),
        (
            "/spec/topologySpreadConstraints/0/matchLabelKeys/0",
            json!("pod-template-hash"),
        ),
        ("/spec/schedulingGates/0/name", json!("ebb.dev/placement")),
        ("/spec/overhead/cpu", json!("10m")),
        (
            "/spec/resources",
            json!({"limits": {"memory": "1Gi"}, "requests": {"cpu": "500m"}, "claims": [{"name": "gpu"}]}),
        ),
        ("/status/phase", json!("Failed")),
        ("/status/reason", json!("Evicted")),
        ("/status/nominatedNodeName", json!("node-2")),
        ("/status/startTime", json!("2026-01-02T03:04:10Z")),
        (
            "/status/conditions",
            json!([
                {"type": "PodScheduled", "status": "True", "reason": null, "lastTransitionTime": "2026-01-02T03:04:06Z"},
                {"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": null},
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "lastTransitionTime": null}
            ]),
        ),
        (
            "/status/containerStatuses",
            json!([{"name": "main", "ready": false, "state": {"terminated": {
            "exitCode": 137, "reason": "OOMKilled", "startedAt": "2026-01-02T03:04:11Z", "finishedAt": "2026-01-02T03:04:12Z"}}}]),
        ),
        (
            "/status/initContainerStatuses/0/state/terminated",
            json!({"exitCode": 0, "reason": "Completed", "startedAt": null, "finishedAt": "2026-01-02T03:04:14Z"}),
        ),
    ];
    for (path, want) in kept {
        let got = v.pointer(path);
        assert_eq!(got, Some(&want), "{path} in {v:#}");
    }
}

/// What Go writes for "unset" in protobuf (empty strings, zeros, an empty time message) is unset
/// here, as its JSON leaves it out; pointer fields keep an empty value.
#[test]
fn empty_values_are_unset_as_in_json() {
    let pod = pb::Pod {
        metadata: Some(pmeta::ObjectMeta {
            name: s("p"),
            namespace: s(""),
            uid: s(""),
            resource_version: s(""),
            creation_timestamp: Some(pmeta::Time::default()),
            ..Default::default()
        }),
        spec: Some(pb::PodSpec {
            node_name: s(""),
            containers: vec![pb::Container {
                name: s("c"),
                resources: Some(pb::ResourceRequirements::default()),
                restart_policy: s(""),
                ..Default::default()
            }],
            volumes: vec![pb::Volume {
                name: s("v"),
                volume_source: Some(pb::VolumeSource {
                    persistent_volume_claim: Some(pb::PersistentVolumeClaimVolumeSource {
                        claim_name: s("c"),
                        read_only: Some(false),
                    }),
                    ..Default::default()
                }),
            }],
            ..Default::default()
        }),
        status: Some(pb::PodStatus {
            phase: s(""),
            reason: s(""),
            nominated_node_name: s(""),
            start_time: Some(pmeta::Time::default()),
            ..Default::default()
        }),
    };
    let got = CachedPod::from_protobuf(pod).expect("converts");
    let want = from_json(json!({
        "metadata": {"name": "p", "creationTimestamp": null},
        "spec": {
            "containers": [{"name": "c", "resources": {}, "restartPolicy": ""}],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]
        },
        "status": {}
    }));
    assert_eq!(got, want);
}

#[test]
fn nanoseconds_are_dropped_as_json_writes_seconds() {
    let mut pod = full_pod();
    if let Some(m) = pod.metadata.as_mut() {
        m.creation_timestamp = Some(pmeta::Time {
            seconds: Some(T0),
            nanos: Some(999_999_999),
        });
    }
    let got = CachedPod::from_protobuf(pod).expect("converts");
    assert_eq!(
        got.metadata.creation_timestamp,
        from_json(full_pod_json()).metadata.creation_timestamp
    );
}

#[test]
fn a_time_out_of_range_is_an_error() {
    let mut pod = full_pod();
    if let Some(s) = pod.status.as_mut() {
        s.start_time = t(i64::MAX);
    }
    assert_eq!(
        CachedPod::from_protobuf(pod),
        Err(ConvertError::Time {
            field: "status.startTime",
            seconds: i64::MAX
        })
    );
}
