//! The ScaleDownPolicy loop against an in-memory API: status by server-side apply and only on
//! change, Events on transitions, drains started from the planner's selection, DryRun writing
//! nothing to nodes, overlaps and bad input making policies Degraded, and the finalizer's cleanup.

mod controller_fake;

use std::sync::Arc;
use std::time::Duration;

use controller_fake::{FakeApi, Logged, fixtures};
use ebb_api::{ScaleDownMode, ScaleDownPolicy};
use ebb_controller::actuation::{EbbTaint, taints};
use ebb_controller::reconcilers::scaledown::{Context, reconcile};
use ebb_controller::testkit::{node, pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use serde_json::Value;

/// Three nodes of pool `a`: `n1` runs only a DaemonSet pod (empty, removable), `n2` and `n3`
/// are 75% requested, a 3-cpu pod each: with `n1` going, neither pod has room elsewhere.
fn cluster(api: &FakeApi) {
    for n in ["n1", "n2", "n3"] {
        api.add_node(node(n).cpu("4").mem("16Gi").label("pool", "a").build());
        api.add_pod(fixtures::logs_pod(n));
    }
    api.add_pod(pod("web-1").on("n2").cpu("3").owned_by_rs("web").build());
    api.add_pod(pod("web-2").on("n3").cpu("3").owned_by_rs("web").build());
}

fn policy(name: &str, mode: ScaleDownMode, pool: &str) -> ScaleDownPolicy {
    let mut p = fixtures::policy(name, mode, pool);
    p.metadata.uid = Some(format!("uid-{name}"));
    p
}

fn context(api: &FakeApi, policies: &[&ScaleDownPolicy]) -> Arc<Context> {
    api.context(policies, 3)
}

fn status_writes(api: &FakeApi) -> Vec<Logged> {
    api.requests("PATCH", "/scaledownpolicies/p/status")
}

fn events(api: &FakeApi) -> Vec<(String, String, String)> {
    api.requests("POST", "/apis/events.k8s.io/v1/")
        .into_iter()
        .map(|l| {
            let b = &l.body;
            (
                b["reason"].as_str().unwrap_or_default().to_string(),
                b["regarding"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                b["regarding"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

fn node_writes(api: &FakeApi) -> usize {
    api.log()
        .iter()
        .filter(|l| l.path.starts_with("/api/v1/nodes") && l.method != "GET")
        .count()
}

/// The policy as the API has it now (status included).
fn current(api: &FakeApi, name: &str) -> ScaleDownPolicy {
    serde_json::from_value(api.policy(name).unwrap()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_loop_plans_taints_drains_and_reports_by_server_side_apply() {
    let api = FakeApi::new();
    cluster(&api);
    let p = policy("p", ScaleDownMode::DrainAndDelete, "a");
    let ctx = context(&api, &[&p]);

    reconcile(Arc::new(p.clone()), ctx.clone()).await.unwrap();

    // The empty node is drained; the busy ones are left alone.
    let n1 = api.node("n1").unwrap();
    assert!(
        taints::has(&n1, EbbTaint::ToBeDeleted),
        "n1 tainted to-be-deleted"
    );
    assert!(!taints::has(&api.node("n2").unwrap(), EbbTaint::Candidate));
    let writes = status_writes(&api);
    assert_eq!(writes.len(), 1);
    let w = &writes[0];
    assert!(
        w.query.contains("fieldManager=ebb-controller"),
        "{}",
        w.query
    );
    assert!(w.query.contains("force=true"), "{}", w.query);
    assert_eq!(w.body["apiVersion"], "ebb.dev/v1alpha1");
    assert_eq!(w.body["kind"], "ScaleDownPolicy");
    let s = &w.body["status"];
    assert_eq!(s["nodesSelected"], 3);
    assert_eq!(s["draining"], 1);
    assert_eq!(s["drainingNodes"][0]["node"], "n1");
    assert_eq!(s["drainingNodes"][0]["phase"], "Tainted");
    assert_eq!(s["observedGeneration"], 1);
    // At the default threshold (1) the busy nodes are simulated too, and stay for want of room.
    let no_place = s["unremovable"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["reason"] == "NoPlaceToMovePods")
        .map(|r| r["count"].clone());
    assert_eq!(no_place, Some(Value::from(2)), "{s}");
    let ready = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "True");
    let evs = events(&api);
    assert!(
        evs.contains(&("DrainStarted".into(), "Node".into(), "n1".into())),
        "{evs:?}"
    );
    assert!(
        evs.contains(&("DrainStarted".into(), "ScaleDownPolicy".into(), "p".into())),
        "{evs:?}"
    );

    // Nothing changed: no status write, no event.
    let before = (status_writes(&api).len(), events(&api).len());
    let p_now = current(&api, "p");
    reconcile(Arc::new(p_now.clone()), ctx.clone())
        .await
        .unwrap();
    let after = status_writes(&api);
    assert_eq!(
        (after.len(), events(&api).len()),
        before,
        "{}\n---\n{}",
        after[0].body["status"],
        after.last().unwrap().body["status"]
    );

    // The drain finishes (no node goes within 5 s of its taint): NodeRemoved once,
    // removedTotal counts it.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(api.node("n1").is_none(), "n1 deleted");
    reconcile(Arc::new(current(&api, "p")), ctx.clone())
        .await
        .unwrap();
    let removed: Vec<_> = events(&api)
        .into_iter()
        .filter(|e| e.0 == "NodeRemoved")
        .collect();
    assert_eq!(removed.len(), 1);
    let s = current(&api, "p").status.unwrap();
    assert_eq!(s.removed_total, 1);
    assert_eq!(s.draining, 0);
    assert_eq!(s.nodes_selected, 2);
    reconcile(Arc::new(current(&api, "p")), ctx).await.unwrap();
    let removed_again = events(&api)
        .into_iter()
        .filter(|e| e.0 == "NodeRemoved")
        .count();
    assert_eq!(removed_again, 1, "not repeated");
}

#[tokio::test(start_paused = true)]
async fn drain_and_delete_without_permission_to_delete_nodes_drains_nothing() {
    let api = FakeApi::new();
    cluster(&api);
    api.set_may_delete_nodes(false);
    let p = policy("p", ScaleDownMode::DrainAndDelete, "a");
    let ctx = context(&api, &[&p]);
    reconcile(Arc::new(p), ctx.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(node_writes(&api), 0, "nothing tainted: {:#?}", api.log());
    assert!(api.requests("POST", "/eviction").is_empty());
    let review = api.requests("POST", "/selfsubjectaccessreviews");
    assert_eq!(review.len(), 1);
    let attrs = &review[0].body["spec"]["resourceAttributes"];
    assert_eq!(
        (attrs["verb"].as_str(), attrs["resource"].as_str()),
        (Some("delete"), Some("nodes"))
    );
    let s = current(&api, "p").status.unwrap();
    let d = ebb_api::conditions::find(&s.conditions, "Degraded").unwrap();
    assert_eq!(
        (d.status.as_str(), d.reason.as_str()),
        ("True", "NodeDeletionForbidden")
    );
    assert!(d.message.contains("allowNodeDeletion"), "{}", d.message);
    assert!(
        events(&api).contains(&("Degraded".into(), "ScaleDownPolicy".into(), "p".into())),
        "{:?}",
        events(&api)
    );

    // The same policy in mode Drain needs no deletion: it drains.
    let api = FakeApi::new();
    cluster(&api);
    api.set_may_delete_nodes(false);
    let p = policy("p", ScaleDownMode::Drain, "a");
    let ctx = context(&api, &[&p]);
    reconcile(Arc::new(p), ctx).await.unwrap();
    assert!(taints::has(&api.node("n1").unwrap(), EbbTaint::ToBeDeleted));
    assert!(api.requests("POST", "/selfsubjectaccessreviews").is_empty());
}

#[tokio::test(start_paused = true)]
async fn dry_run_writes_nothing_to_nodes_or_pods() {
    let api = FakeApi::new();
    cluster(&api);
    let p = policy("p", ScaleDownMode::DryRun, "a");
    let ctx = context(&api, &[&p]);
    reconcile(Arc::new(p), ctx.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    reconcile(Arc::new(current(&api, "p")), ctx).await.unwrap();
    assert_eq!(node_writes(&api), 0, "{:#?}", api.log());
    assert!(api.requests("POST", "/eviction").is_empty());
    let s = current(&api, "p").status.unwrap();
    assert_eq!(s.candidates, 1, "n1 is still reported");
    assert_eq!(s.candidate_nodes[0].node, "n1");
    assert_eq!(s.candidate_nodes[0].waiting_for.as_deref(), Some("DryRun"));
}

#[tokio::test(start_paused = true)]
async fn overlapping_policies_are_degraded_and_leave_the_shared_node_alone() {
    let api = FakeApi::new();
    cluster(&api);
    // `q` selects n1 too (by its hostname label).
    let p = policy("p", ScaleDownMode::DrainAndDelete, "a");
    let mut q = policy("q", ScaleDownMode::DrainAndDelete, "a");
    q.spec.node_selector = LabelSelector {
        match_labels: Some([("kubernetes.io/hostname".to_string(), "n1".to_string())].into()),
        ..Default::default()
    };
    let ctx = context(&api, &[&p, &q]);
    reconcile(Arc::new(p), ctx.clone()).await.unwrap();
    reconcile(Arc::new(q), ctx).await.unwrap();
    assert_eq!(node_writes(&api), 0, "n1 is shared: nobody touches it");
    for name in ["p", "q"] {
        let s = current(&api, name).status.unwrap();
        let d = ebb_api::conditions::find(&s.conditions, "Degraded").unwrap();
        assert_eq!(
            (d.status.as_str(), d.reason.as_str()),
            ("True", "OverlappingPolicies")
        );
        assert!(d.message.contains("n1"), "{}", d.message);
        let other = if name == "p" { "q" } else { "p" };
        assert!(d.message.contains(other), "{}", d.message);
        assert!(
            s.unremovable_nodes
                .iter()
                .any(|u| u.node == "n1" && u.reason.as_str() == "OverlappingPolicies")
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_selector_matching_nothing_degrades_the_policy_with_an_event() {
    let api = FakeApi::new();
    cluster(&api);
    let p = policy("p", ScaleDownMode::DrainAndDelete, "nope");
    let ctx = context(&api, &[&p]);
    reconcile(Arc::new(p), ctx.clone()).await.unwrap();
    assert_eq!(node_writes(&api), 0);
    let s = current(&api, "p").status.unwrap();
    let ready = ebb_api::conditions::find(&s.conditions, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "SelectorMatchesNothing")
    );
    let evs = events(&api);
    assert_eq!(
        evs,
        vec![("Degraded".into(), "ScaleDownPolicy".into(), "p".into())]
    );
    let note = &api.requests("POST", "/events")[0].body["note"];
    assert!(note.as_str().unwrap().contains("matches no node"), "{note}");
    assert_eq!(api.requests("POST", "/events")[0].body["type"], "Warning");
    // Said once.
    reconcile(Arc::new(current(&api, "p")), ctx).await.unwrap();
    assert_eq!(events(&api).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn deleting_a_policy_removes_its_taints_and_its_finalizer() {
    let api = FakeApi::new();
    let t = jiff::Timestamp::from_second(1_700_000_000).unwrap();
    let soft = EbbTaint::Candidate.at(t);
    let hard = EbbTaint::ToBeDeleted.at(t);
    api.add_node(
        node("n1")
            .cpu("4")
            .label("pool", "a")
            .taint(soft.clone())
            .taint(hard.clone())
            .build(),
    );
    api.add_node(
        node("n9")
            .cpu("4")
            .label("pool", "b")
            .taint(soft.clone())
            .build(),
    );
    let mut p = policy("p", ScaleDownMode::DrainAndDelete, "a");
    p.metadata.deletion_timestamp = Some(Time(t));
    let ctx = context(&api, &[&p]);
    reconcile(Arc::new(p), ctx).await.unwrap();
    let n1 = api.node("n1").unwrap();
    assert!(!taints::has(&n1, EbbTaint::Candidate));
    assert!(!taints::has(&n1, EbbTaint::ToBeDeleted));
    assert!(
        taints::has(&api.node("n9").unwrap(), EbbTaint::Candidate),
        "another policy's node is not this policy's to clean"
    );
    let finalizers = &api.policy("p").unwrap()["metadata"]["finalizers"];
    assert_eq!(finalizers, &serde_json::json!([]), "finalizer removed");
}

#[tokio::test(start_paused = true)]
async fn a_malformed_object_in_the_cluster_degrades_the_policy_and_stops_it() {
    let api = FakeApi::new();
    cluster(&api);
    api.add_pod(
        pod("broken")
            .on("n2")
            .cpu("lots")
            .owned_by_rs("web")
            .build(),
    );
    let p = policy("p", ScaleDownMode::DrainAndDelete, "a");
    let ctx = context(&api, &[&p]);
    reconcile(Arc::new(p), ctx).await.unwrap();
    assert_eq!(node_writes(&api), 0, "acts on nothing");
    let s = current(&api, "p").status.unwrap();
    let d = ebb_api::conditions::find(&s.conditions, "Degraded").unwrap();
    assert_eq!(
        (d.status.as_str(), d.reason.as_str()),
        ("True", "InvalidClusterObject")
    );
    assert!(
        d.message.contains("broken"),
        "names the object: {}",
        d.message
    );
    let ready = ebb_api::conditions::find(&s.conditions, "Ready").unwrap();
    assert_eq!(ready.status, "False");
}

#[test]
fn the_snapshot_leaves_out_pods_of_nodes_that_are_gone() {
    let api = FakeApi::new();
    api.add_node(node("n1").cpu("4").build());
    api.add_pod(pod("here").on("n1").build());
    api.add_pod(pod("orphan").on("deleted-node").build());
    api.add_pod(pod("pending").build());
    let objects = api.stores().objects();
    let mut names: Vec<String> = objects
        .pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, vec!["here", "pending"]);
    assert!(ebb_controller::cluster::build_snapshot(&objects).is_ok());
}

#[tokio::test(start_paused = true)]
async fn switching_to_dry_run_stops_the_drains_and_removes_the_taints() {
    let api = FakeApi::new();
    cluster(&api);
    // Keep the drain in Evicting long enough to switch modes under it.
    api.add_pod(pod("web-3").on("n1").cpu("100m").owned_by_rs("web").build());
    api.script_evictions("default/web-3", &[429; 50]);
    let p = policy("p", ScaleDownMode::DrainAndDelete, "a");
    let ctx = context(&api, &[&p]);
    reconcile(Arc::new(p), ctx.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(
        api.node("n1")
            .is_some_and(|n| taints::has(&n, EbbTaint::ToBeDeleted))
    );
    let mut dry = current(&api, "p");
    dry.spec.mode = ScaleDownMode::DryRun;
    reconcile(Arc::new(dry), ctx.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let n1 = api.node("n1").expect("n1 kept");
    assert!(
        !taints::has(&n1, EbbTaint::ToBeDeleted),
        "drain rolled back"
    );
    assert!(!taints::has(&n1, EbbTaint::Candidate));
    assert!(ctx.actuator.tracker().in_flight().is_empty());
    let failed: Vec<_> = {
        let mut dry = current(&api, "p");
        dry.spec.mode = ScaleDownMode::DryRun;
        reconcile(Arc::new(dry), ctx).await.unwrap();
        events(&api)
            .into_iter()
            .filter(|e| e.0 == "DrainFailed")
            .collect()
    };
    assert!(!failed.is_empty(), "the cancelled drain is reported");
}
