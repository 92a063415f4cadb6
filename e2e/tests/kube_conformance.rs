//! kube-rs client conformance against the simulator's API server: CRUD, conflicts, selectors,
//! pagination, watch resume and 410, patch kinds, server-side apply ownership, status
//! subresource and CRD defaults, finalizers, garbage collection and eviction with PDBs.

use std::time::Duration;

use ebb_e2e::{Sim, SimConfig};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::policy::v1::{Eviction, PodDisruptionBudget};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy, WatchEvent,
    WatchParams,
};
use kube::core::{DynamicObject, Status};
use serde_json::json;

async fn sim() -> (Sim, kube::Client) {
    let s = Sim::start(SimConfig::api_only()).await.expect("sim starts");
    let c = s.client().await.expect("client");
    (s, c)
}

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

fn pod(name: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
    .unwrap()
}

fn api_err(e: kube::Error) -> Status {
    match e {
        kube::Error::Api(s) => (*s).clone(),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_get_conflicts_and_generate_name() {
    let (_s, c) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(c, "default");
    let a = cms
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let rv = a.metadata.resource_version.clone().unwrap();
    assert!(a.metadata.uid.is_some() && a.metadata.creation_timestamp.is_some());
    let e = api_err(
        cms.create(&PostParams::default(), &cm("a", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));

    let mut upd = a.clone();
    upd.data = Some([("k".to_string(), "w".to_string())].into());
    let b = cms
        .replace("a", &PostParams::default(), &upd)
        .await
        .unwrap();
    assert_ne!(b.metadata.resource_version.as_deref(), Some(rv.as_str()));
    // `upd` still carries the old resourceVersion: a stale write.
    upd.data = Some([("k".to_string(), "x".to_string())].into());
    let e = api_err(
        cms.replace("a", &PostParams::default(), &upd)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.contains("the object has been modified"),
        "{}",
        e.message
    );

    // A write that changes nothing keeps the resourceVersion.
    let same = cms.replace("a", &PostParams::default(), &b).await.unwrap();
    assert_eq!(same.metadata.resource_version, b.metadata.resource_version);

    let mut g = cm("", json!({}));
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let made = cms.create(&PostParams::default(), &g).await.unwrap();
    let name = made.metadata.name.unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    let e = api_err(cms.get("missing").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    let other_ns: Api<ConfigMap> = Api::namespaced(cms.into_client(), "nope");
    let e = api_err(
        other_ns
            .create(&PostParams::default(), &cm("x", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        e.code, 404,
        "creating in a missing namespace fails: {}",
        e.message
    );
}

#[tokio::test]
async fn list_selectors_and_pagination() {
    let (_s, c) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    for i in 0..25 {
        let tier = if i % 2 == 0 { "a" } else { "b" };
        cms.create(
            &PostParams::default(),
            &cm(
                &format!("cm-{i:02}"),
                json!({"tier": tier, "n": i.to_string()}),
            ),
        )
        .await
        .unwrap();
    }
    let sys: Api<ConfigMap> = Api::namespaced(c.clone(), "kube-system");
    sys.create(&PostParams::default(), &cm("other", json!({"tier": "a"})))
        .await
        .unwrap();

    let a = cms
        .list(&ListParams::default().labels("tier in (a),n notin (0,2)"))
        .await
        .unwrap();
    assert_eq!(a.items.len(), 11);
    let all_ns: Api<ConfigMap> = Api::all(c.clone());
    assert_eq!(
        all_ns
            .list(&ListParams::default().labels("tier=a"))
            .await
            .unwrap()
            .items
            .len(),
        14
    );
    let by_name = cms
        .list(&ListParams::default().fields("metadata.name=cm-03"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);

    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(10);
    let mut pages = 0;
    loop {
        let page = cms.list(&lp).await.unwrap();
        pages += 1;
        names.extend(page.items.iter().filter_map(|o| o.metadata.name.clone()));
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => lp = lp.continue_token(&t),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names.len(), 25);
    let mut sorted = names.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), 25, "no duplicates across pages");

    let e = api_err(
        cms.list(&ListParams::default().labels("a in b"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    let e = api_err(
        cms.list(&ListParams::default().fields("spec.nope=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
}

#[tokio::test]
async fn watch_resume_bookmarks_and_gone() {
    let (s, c) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let first = cms
        .create(&PostParams::default(), &cm("w1", json!({"x": "1"})))
        .await
        .unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    cms.create(&PostParams::default(), &cm("w2", json!({"x": "1"})))
        .await
        .unwrap();
    cms.delete("w1", &DeleteParams::default()).await.unwrap();

    // Resume after w1's creation: see w2 added and w1 deleted, in order.
    let mut stream = cms
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match stream.try_next().await.unwrap() {
            Some(WatchEvent::Added(o)) => seen.push(format!("ADDED {}", o.metadata.name.unwrap())),
            Some(WatchEvent::Deleted(o)) => {
                seen.push(format!("DELETED {}", o.metadata.name.unwrap()))
            }
            Some(other) => panic!("unexpected {other:?}"),
            None => break,
        }
    }
    assert_eq!(seen, vec!["ADDED w2", "DELETED w1"]);

    // Label-filtered watch: a label change out of the selector is a DELETED.
    let now_rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut filtered = cms
        .watch(&WatchParams::default().labels("x=1").timeout(5), &now_rv)
        .await
        .unwrap()
        .boxed();
    cms.patch(
        "w2",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "2"}}})),
    )
    .await
    .unwrap();
    match filtered.try_next().await.unwrap() {
        Some(WatchEvent::Deleted(o)) => assert_eq!(o.metadata.name.as_deref(), Some("w2")),
        other => panic!("expected DELETED, got {other:?}"),
    }

    // After compaction the old version is gone: the apiserver answers with an ERROR event 410.
    s.compact();
    let mut old = cms
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    match old.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 error event, got {other:?}"),
    }

    // Bookmarks are sent when asked for.
    let cur = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut bm = cms
        .watch(&WatchParams::default().timeout(8), &cur)
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(Duration::from_secs(8), bm.try_next()).await {
        Ok(Ok(Some(WatchEvent::Bookmark(b)))) => assert!(!b.metadata.resource_version.is_empty()),
        other => panic!("expected a bookmark, got {other:?}"),
    }
}

#[tokio::test]
async fn runtime_watcher_sees_changes() {
    use kube::runtime::{WatchStreamExt, watcher};
    let (_s, c) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let mut stream = watcher(cms.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    cms.create(&PostParams::default(), &cm("r1", json!({})))
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(o) = stream.try_next().await.unwrap() {
            if o.metadata.name.as_deref() == Some("r1") {
                return o;
            }
        }
        panic!("watch ended");
    })
    .await
    .expect("watcher saw r1");
    assert_eq!(got.data.unwrap().get("k").map(String::as_str), Some("v"));
}

#[tokio::test]
async fn patch_kinds() {
    let (_s, c) = sim().await;
    let nodes: Api<Node> = Api::all(c.clone());
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "labels": {"a": "1"}},
        "spec": {"taints": [{"key": "t1", "effect": "NoSchedule"}]}}))
    .unwrap();
    nodes.create(&PostParams::default(), &n).await.unwrap();
    // Strategic merge: taints merge by key; labels merge.
    let p = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"b": "2"}},
            "spec": {"taints": [{"key": "t2", "effect": "NoExecute"}]}})),
        )
        .await
        .unwrap();
    let taints = p.spec.unwrap().taints.unwrap();
    assert_eq!(
        taints.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(),
        vec!["t1", "t2"]
    );
    assert_eq!(p.metadata.labels.unwrap().len(), 2);
    // JSON merge patch replaces lists.
    let p = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [{"key": "t3", "effect": "NoSchedule"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(p.spec.unwrap().taints.unwrap().len(), 1);
    // JSON patch with test: a missing path tests as null.
    let ops: json_patch_ops::Ops = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]}]))
    .unwrap();
    let p = nodes
        .patch("n1", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert_eq!(p.metadata.finalizers, Some(vec!["x/y".to_string()]));
    let ops: json_patch_ops::Ops = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/a", "value": "wrong"},
        {"op": "remove", "path": "/metadata/finalizers"}]))
    .unwrap();
    let e = api_err(
        nodes
            .patch("n1", &PatchParams::default(), &Patch::<()>::Json(ops))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        nodes.get("n1").await.unwrap().metadata.finalizers.is_some(),
        "failed patch changed nothing"
    );
}

mod json_patch_ops {
    pub type Ops = json_patch::Patch;
}

#[tokio::test]
async fn server_side_apply_ownership() {
    let (_s, c) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let cfg = |v: &str, extra: bool| {
        let mut d = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"owned": v}});
        if extra {
            d["data"]["extra"] = json!("e");
        }
        d
    };
    let a = cms
        .patch(
            "ssa",
            &PatchParams::apply("mgr-a"),
            &Patch::Apply(cfg("1", true)),
        )
        .await
        .unwrap();
    let mf = a.metadata.managed_fields.clone().unwrap();
    assert_eq!(mf.len(), 1);
    assert_eq!(
        (mf[0].manager.as_deref(), mf[0].operation.as_deref()),
        (Some("mgr-a"), Some("Apply"))
    );
    // Re-applying the same config is a no-op.
    let again = cms
        .patch(
            "ssa",
            &PatchParams::apply("mgr-a"),
            &Patch::Apply(cfg("1", true)),
        )
        .await
        .unwrap();
    assert_eq!(again.metadata.resource_version, a.metadata.resource_version);
    // Another manager changing an owned field conflicts...
    let e = api_err(
        cms.patch(
            "ssa",
            &PatchParams::apply("mgr-b"),
            &Patch::Apply(cfg("2", false)),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 409);
    assert!(
        e.message.contains("conflict with \"mgr-a\": .data.owned"),
        "{}",
        e.message
    );
    // ...unless forced, which moves ownership.
    let b = cms
        .patch(
            "ssa",
            &PatchParams::apply("mgr-b").force(),
            &Patch::Apply(cfg("2", false)),
        )
        .await
        .unwrap();
    assert_eq!(b.data.as_ref().unwrap()["owned"], "2");
    // mgr-a drops `extra` from its config: the field goes; `owned` is mgr-b's now and stays.
    let a2 = cms
        .patch(
            "ssa",
            &PatchParams::apply("mgr-a"),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}}),
            ),
        )
        .await
        .unwrap();
    let data = a2.data.unwrap();
    assert_eq!(data.get("owned").map(String::as_str), Some("2"));
    assert!(!data.contains_key("extra"));
    // Apply creates when missing.
    let made = cms.patch("ssa-new", &PatchParams::apply("mgr-a"), &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa-new"}, "data": {"a": "b"}}))).await.unwrap();
    assert!(made.metadata.uid.is_some());
}

async fn install_ebb_crds(c: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    for crd in ebb_api::crdgen::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
}

fn dyn_api(c: &kube::Client, plural: &str, kind: &str, ns: Option<&str>) -> Api<DynamicObject> {
    let ar = kube::api::ApiResource {
        group: "ebb.dev".into(),
        version: "v1alpha1".into(),
        api_version: "ebb.dev/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    match ns {
        Some(n) => Api::namespaced_with(c.clone(), n, &ar),
        None => Api::all_with(c.clone(), &ar),
    }
}

#[tokio::test]
async fn crd_defaults_validation_status_and_generation() {
    let (_s, c) = sim().await;
    install_ebb_crds(&c).await;
    // Discovery now lists the group.
    let groups = c.list_api_groups().await.unwrap();
    assert!(groups.groups.iter().any(|g| g.name == "ebb.dev"));

    let sdp = dyn_api(&c, "scaledownpolicies", "ScaleDownPolicy", None);
    let obj: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "ebb.dev/v1alpha1", "kind": "ScaleDownPolicy",
        "metadata": {"name": "p"}, "spec": {}, "status": {"candidates": 7}}),
    )
    .unwrap();
    let made = sdp.create(&PostParams::default(), &obj).await.unwrap();
    assert_eq!(
        made.data["spec"]["unneededTime"],
        json!("10m"),
        "schema default applied"
    );
    assert_eq!(made.data["spec"]["mode"], json!("DryRun"));
    assert!(
        made.data.get("status").is_none(),
        "status is ignored on create"
    );
    assert_eq!(made.metadata.generation, Some(1));

    // Status endpoint changes status only; generation stays.
    let st = sdp
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observedGeneration": 1}, "spec": {"mode": "Drain"}})),
        )
        .await
        .unwrap();
    assert_eq!(st.data["status"]["observedGeneration"], json!(1));
    assert_eq!(st.data["spec"]["mode"], json!("DryRun"));
    assert_eq!(st.metadata.generation, Some(1));
    // Main endpoint ignores status; a spec change bumps generation; a label change does not.
    let sp = sdp
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"mode": "Drain"}, "status": {"observedGeneration": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(sp.metadata.generation, Some(2));
    assert_eq!(sp.data["status"]["observedGeneration"], json!(1));
    let lp = sdp
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(lp.metadata.generation, Some(2));
    // Strategic merge is not allowed on custom resources.
    let e = api_err(
        sdp.patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 415);
    // Schema validation: an enum value that is not allowed is rejected.
    let e = api_err(
        sdp.patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"mode": "Explode"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    // CEL: NodeState.spec.nodeName is immutable.
    let ns = dyn_api(&c, "nodestates", "NodeState", None);
    let obj: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "ebb.dev/v1alpha1", "kind": "NodeState",
        "metadata": {"name": "n1"}, "spec": {"nodeName": "n1"}}),
    )
    .unwrap();
    ns.create(&PostParams::default(), &obj).await.unwrap();
    let e = api_err(
        ns.patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "n2"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(e.message.contains("nodeName is immutable"), "{}", e.message);
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let (_s, c) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let mut f = cm("fin", json!({}));
    f.metadata.finalizers = Some(vec!["ebb.dev/test".into()]);
    cms.create(&PostParams::default(), &f).await.unwrap();
    let d = cms.delete("fin", &DeleteParams::default()).await.unwrap();
    let pending = d
        .left()
        .expect("deletion is pending while a finalizer remains");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert!(
        cms.get("fin")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    let rv = pending.metadata.resource_version.clone().unwrap();
    let mut w = cms
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    cms.patch(
        "fin",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    match w.try_next().await.unwrap() {
        Some(WatchEvent::Deleted(o)) => assert_eq!(o.metadata.name.as_deref(), Some("fin")),
        other => panic!("expected DELETED, got {other:?}"),
    }
    assert_eq!(api_err(cms.get("fin").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn garbage_collection_background_foreground_orphan() {
    let (_s, c) = sim().await;
    let nodes: Api<Node> = Api::all(c.clone());
    let owner = nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap(),
        )
        .await
        .unwrap();
    install_ebb_crds(&c).await;
    let ns_api = dyn_api(&c, "nodestates", "NodeState", None);
    let owned = |name: &str, uid: &str| -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "ebb.dev/v1alpha1", "kind": "NodeState",
            "metadata": {"name": name, "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": uid, "blockOwnerDeletion": true}]},
            "spec": {"nodeName": name}})).unwrap()
    };
    let uid = owner.metadata.uid.clone().unwrap();
    ns_api
        .create(&PostParams::default(), &owned("n1", &uid))
        .await
        .unwrap();
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        api_err(ns_api.get("n1").await.unwrap_err()).code,
        404,
        "NodeState goes with its Node"
    );

    // Orphan keeps the dependent and drops the reference.
    let o2 = nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap(),
        )
        .await
        .unwrap();
    ns_api
        .create(
            &PostParams::default(),
            &owned("n1", o2.metadata.uid.as_deref().unwrap()),
        )
        .await
        .unwrap();
    nodes
        .delete(
            "n1",
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Orphan),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let kept = ns_api.get("n1").await.unwrap();
    assert!(
        kept.metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );

    // Foreground: the owner waits (finalizer) until the dependent is gone.
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let mut dep = cm("dep", json!({}));
    dep.metadata.finalizers = Some(vec!["hold".into()]);
    let o3 = cms
        .create(&PostParams::default(), &cm("own", json!({})))
        .await
        .unwrap();
    dep.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "own".into(),
            uid: o3.metadata.uid.unwrap(),
            block_owner_deletion: Some(true),
            controller: None,
        },
    ]);
    cms.create(&PostParams::default(), &dep).await.unwrap();
    cms.delete("own", &DeleteParams::foreground())
        .await
        .unwrap();
    let own = cms.get("own").await.unwrap();
    assert!(
        own.metadata
            .finalizers
            .unwrap()
            .contains(&"foregroundDeletion".to_string())
    );
    assert!(
        cms.get("dep")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    cms.patch(
        "dep",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(
        api_err(cms.get("own").await.unwrap_err()).code,
        404,
        "owner goes once its dependent went"
    );
}

#[tokio::test]
async fn eviction_respects_pdb() {
    let (s, c) = sim().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    for n in ["p1", "p2"] {
        pods.create(&PostParams::default(), &pod(n, json!({"app": "web"})))
            .await
            .unwrap();
        // Running and Ready, as a kubelet would report.
        pods.patch_status(
            n,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .unwrap();
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.clone(), "default");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    pdbs.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"observedGeneration": 1,
        "disruptionsAllowed": 0, "currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 2}})),
    )
    .await
    .unwrap();

    let e = api_err(pods.evict("p1", &Default::default()).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (429, "TooManyRequests"));
    assert_eq!(
        e.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert!(pods.get("p1").await.is_ok());

    pdbs.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"disruptionsAllowed": 1}})),
    )
    .await
    .unwrap();
    pods.evict("p1", &Default::default()).await.unwrap();
    assert_eq!(
        api_err(pods.get("p1").await.unwrap_err()).code,
        404,
        "unbound pod goes at once"
    );
    let after = pdbs.get("web").await.unwrap().status.unwrap();
    assert_eq!(
        after.disruptions_allowed, 0,
        "the eviction consumed the allowance"
    );
    assert!(after.disrupted_pods.unwrap().contains_key("p1"));
    let e = api_err(pods.evict("p2", &Default::default()).await.unwrap_err());
    assert_eq!(e.code, 429);
    assert!(s.pdb_violations().is_empty());

    // A plain delete while the budget allows nothing is recorded as a violation.
    pods.delete("p2", &DeleteParams::default()).await.unwrap();
    let v = s.pdb_violations();
    assert_eq!(v.len(), 1);
    assert_eq!(
        (v[0].pod.as_str(), v[0].pdb.as_str(), v[0].user.as_str()),
        ("p2", "web", "admin")
    );
    let _ = Eviction::default();
}

#[tokio::test]
async fn graceful_pod_deletion_and_audit_user() {
    let (s, _c) = sim().await;
    let c = s.client_as("alice").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(&PostParams::default(), &pod("g", json!({})))
        .await
        .unwrap();
    let bind = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "g"}, "target": {"kind": "Node", "name": "n1"}});
    let req = http_post(&s.url(), "/api/v1/namespaces/default/pods/g/binding", &bind).await;
    assert_eq!(req, 201);
    assert_eq!(
        pods.get("g")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .as_deref(),
        Some("n1")
    );
    assert_eq!(
        http_post(&s.url(), "/api/v1/namespaces/default/pods/g/binding", &bind).await,
        409,
        "binding twice conflicts"
    );
    // A bound pod stays, terminating, for its grace period.
    let d = pods
        .delete("g", &DeleteParams::default().grace_period(30))
        .await
        .unwrap();
    let p = d.left().unwrap();
    assert!(p.metadata.deletion_timestamp.is_some());
    assert_eq!(p.metadata.deletion_grace_period_seconds, Some(30));
    pods.delete("g", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert_eq!(api_err(pods.get("g").await.unwrap_err()).code, 404);
    let audit = s.audit();
    assert!(
        audit.iter().any(|r| r.user == "alice"
            && r.verb == "create"
            && r.resource == "pods"
            && r.name == "g"
            && r.code == 201),
        "{audit:?}"
    );
    assert!(
        audit
            .iter()
            .any(|r| r.user == "alice" && r.verb == "delete" && r.name == "g")
    );
}

async fn http_post(base: &str, path: &str, body: &serde_json::Value) -> u16 {
    let client = kube::Client::try_from(kube::Config::new(base.parse().unwrap())).unwrap();
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .unwrap();
    match client.request_text(req).await {
        Ok(_) => 201,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn unknown_paths_and_methods_answer_with_status() {
    let (s, c) = sim().await;
    let _ = s;
    let req = http::Request::get("/apis/nope.dev/v1/things")
        .body(Vec::new())
        .unwrap();
    match c.request_text(req).await {
        Err(kube::Error::Api(st)) => assert_eq!(st.code, 404),
        other => panic!("expected 404, got {other:?}"),
    }
    let req = http::Request::put("/api/v1/namespaces/default/configmaps")
        .body(b"{}".to_vec())
        .unwrap();
    match c.request_text(req).await {
        Err(kube::Error::Api(st)) => assert_eq!(st.code, 405),
        other => panic!("expected 405, got {other:?}"),
    }
}

#[tokio::test]
async fn runtime_controller_with_finalizer_helper() {
    use kube::runtime::controller::{Action, Controller};
    use kube::runtime::finalizer::{Event as Fin, finalizer};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Debug, thiserror::Error)]
    #[error("never")]
    struct Never;

    let (_s, c) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let cleanups = Arc::new(AtomicUsize::new(0));
    let ctx = Arc::new((cms.clone(), cleanups.clone()));
    let ctl = Controller::new(cms.clone(), Default::default())
        .run(
            |obj: Arc<ConfigMap>, ctx: Arc<(Api<ConfigMap>, Arc<AtomicUsize>)>| async move {
                let counter = ctx.1.clone();
                finalizer(&ctx.0, "ebb.dev/test-cleanup", obj, |ev| async move {
                    match ev {
                        Fin::Apply(_) => Ok::<_, Never>(Action::await_change()),
                        Fin::Cleanup(_) => {
                            counter.fetch_add(1, Ordering::SeqCst);
                            Ok(Action::await_change())
                        }
                    }
                })
                .await
            },
            |_obj, _err, _ctx| Action::requeue(Duration::from_millis(200)),
            ctx,
        )
        .for_each(|_| async {});
    let handle = tokio::spawn(ctl);
    cms.create(&PostParams::default(), &cm("ctl", json!({})))
        .await
        .unwrap();
    let with_fin = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let o = cms.get("ctl").await.unwrap();
            if o.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.contains(&"ebb.dev/test-cleanup".to_string()))
            {
                return o;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the controller added its finalizer");
    assert!(with_fin.metadata.deletion_timestamp.is_none());
    cms.delete("ctl", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while cms.get("ctl").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the controller's cleanup removed the finalizer and the object went");
    assert_eq!(cleanups.load(Ordering::SeqCst), 1);
    handle.abort();
}

#[tokio::test]
async fn lease_manager_elects_one_leader_and_hands_over() {
    use kube_lease_manager::LeaseManagerBuilder;
    let (_s, c) = sim().await;
    let a = LeaseManagerBuilder::new(c.clone(), "ebb-leader")
        .with_identity("a")
        .with_duration(2)
        .with_grace(1)
        .build()
        .await
        .unwrap();
    let b = LeaseManagerBuilder::new(c.clone(), "ebb-leader")
        .with_identity("b")
        .with_duration(2)
        .with_grace(1)
        .build()
        .await
        .unwrap();
    let (mut a_rx, a_task) = a.watch().await;
    tokio::time::timeout(Duration::from_secs(10), a_rx.wait_for(|l| *l))
        .await
        .expect("a leads in time")
        .unwrap();
    let (b_rx, b_task) = b.watch().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!*b_rx.borrow(), "only one leader");
    let lease: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.clone(), "default");
    assert_eq!(
        lease
            .get("ebb-leader")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("a")
    );
    // a steps down: b takes over.
    drop(a_rx);
    let a_mgr = a_task.await.unwrap().unwrap();
    a_mgr.release().await.unwrap();
    let mut b_rx = b_rx;
    tokio::time::timeout(Duration::from_secs(10), b_rx.wait_for(|l| *l))
        .await
        .expect("b takes over")
        .unwrap();
    drop(b_rx);
    let _ = b_task.await;
}

#[tokio::test]
async fn server_side_apply_on_status_subresource() {
    let (_s, c) = sim().await;
    install_ebb_crds(&c).await;
    let ns = dyn_api(&c, "nodestates", "NodeState", None);
    let spec = json!({"apiVersion": "ebb.dev/v1alpha1", "kind": "NodeState", "metadata": {"name": "n1"}, "spec": {"nodeName": "n1"}});
    ns.patch(
        "n1",
        &PatchParams::apply("ebb-node-agent"),
        &Patch::Apply(spec),
    )
    .await
    .unwrap();
    let status = json!({"apiVersion": "ebb.dev/v1alpha1", "kind": "NodeState", "metadata": {"name": "n1"},
        "spec": {"nodeName": "ignored"}, "status": {"agentVersion": "1.2.3"}});
    let got = ns
        .patch_status(
            "n1",
            &PatchParams::apply("ebb-node-agent").force(),
            &Patch::Apply(status),
        )
        .await
        .unwrap();
    assert_eq!(got.data["status"]["agentVersion"], json!("1.2.3"));
    assert_eq!(
        got.data["spec"]["nodeName"],
        json!("n1"),
        "the status endpoint ignores spec"
    );
    let mf = got.metadata.managed_fields.unwrap();
    assert!(
        mf.iter()
            .any(|m| m.manager.as_deref() == Some("ebb-node-agent")
                && m.subresource.as_deref() == Some("status"))
    );
    // Applying the main resource again does not touch status.
    let spec2 = json!({"apiVersion": "ebb.dev/v1alpha1", "kind": "NodeState", "metadata": {"name": "n1", "labels": {"a": "b"}}, "spec": {"nodeName": "n1"}});
    let after = ns
        .patch(
            "n1",
            &PatchParams::apply("ebb-node-agent"),
            &Patch::Apply(spec2),
        )
        .await
        .unwrap();
    assert_eq!(after.data["status"]["agentVersion"], json!("1.2.3"));
}

#[tokio::test]
async fn delete_collection_by_label() {
    let (_s, c) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    for (n, t) in [("a", "x"), ("b", "x"), ("c", "y")] {
        cms.create(&PostParams::default(), &cm(n, json!({"t": t})))
            .await
            .unwrap();
    }
    let gone = cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("t=x"),
        )
        .await
        .unwrap();
    let names: Vec<String> = gone
        .left()
        .unwrap()
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    assert_eq!(names, vec!["a", "b"]);
    let left: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    assert_eq!(left, vec!["c"]);
}
