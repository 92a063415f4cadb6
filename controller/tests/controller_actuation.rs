//! The actuator against an in-memory API: eviction retries on 429, taint writes with conflict
//! retries, whole drains per mode, roll-back when pods land, evictions time out or a policy goes.

mod controller_fake;

use ebb_controller::state::Leadership;
use std::collections::BTreeSet;
use std::time::Duration;

use controller_fake::FakeApi;
use ebb_api::ScaleDownMode;
use ebb_api::names::{LABEL_DRAINED, TAINT_TO_BE_DELETED};
use ebb_controller::actuation::RecheckInputs;
use ebb_controller::actuation::budget_gate::{Admission, DisruptionGate};
use ebb_controller::actuation::drain::EvictionCall;
use ebb_controller::actuation::evict::{EvictionObserver, Evictor, InFlight, evict_with_retry};
use ebb_controller::actuation::pacing::Pacer;
use ebb_controller::actuation::pods::{PodRef, uids_on};
use ebb_controller::actuation::taints;
use ebb_controller::actuation::{
    Actuator, DrainOrder, EbbTaint, EvictionSettings, GiveUpReason, Outcome, Tracker, Written,
    runner::RECORDED_TIMEOUT,
};
use ebb_controller::metrics::{Metrics, ScaleDownKind};
use ebb_controller::testkit::{node, pod};
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

fn settings() -> EvictionSettings {
    EvictionSettings {
        grace_cap: Duration::from_secs(60),
        retry_interval: Duration::from_secs(10),
        max_time: Duration::from_secs(120),
        parallelism: 4,
    }
}

struct Calls(std::sync::Mutex<Vec<EvictionCall>>);
impl EvictionObserver for Calls {
    fn on_call(&self, _pod: &PodRef, call: &EvictionCall) {
        self.0.lock().unwrap().push(call.clone());
    }
}

fn pod_ref(name: &str, grace: Option<i64>) -> PodRef {
    PodRef {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-default-{name}"),
        grace,
    }
}

/// Evicts `pod` through `api` for policy `p` with [`settings`], no budgets gating it.
async fn evict_as_p(api: &FakeApi, pod: &PodRef, calls: &Calls, metrics: &Metrics) -> bool {
    evict_within(api, pod, calls, metrics, &Leadership::default()).await
}

/// [`evict_as_p`] within `fence`.
async fn evict_within(
    api: &FakeApi,
    pod: &PodRef,
    calls: &Calls,
    metrics: &Metrics,
    fence: &Leadership,
) -> bool {
    let gate = DisruptionGate::new(api.pod_store(), api.pod_changes());
    let ev = Evictor {
        fence,
        client: api.client(),
        gate: &gate,
        in_flight: &InFlight::default(),
        pacer: &Pacer::off(),
        drain: 0,
        metrics,
        policy: "p",
        observer: calls,
    };
    evict_with_retry(&ev, pod, &settings(), &CancellationToken::new()).await
}

/// A replica whose Lease may be another's sends no Eviction at all.
#[tokio::test(start_paused = true)]
async fn a_fenced_replica_sends_no_eviction() {
    let api = FakeApi::new();
    api.add_pod(pod("web-1").on("n1").build());
    let calls = Calls(Default::default());
    let fence = Leadership::default();
    fence.fence_now();
    let evicted = evict_within(
        &api,
        &pod_ref("web-1", None),
        &calls,
        &Metrics::new(),
        &fence,
    )
    .await;
    assert!(!evicted);
    assert!(calls.0.lock().unwrap().is_empty(), "an Eviction was sent");
    assert!(
        api.pod_store()
            .state()
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some("web-1"))
    );
}

#[tokio::test(start_paused = true)]
async fn a_pdb_429_is_retried_every_interval_until_accepted() {
    let api = FakeApi::new();
    api.add_pod(pod("web-1").on("n1").build());
    api.script_evictions("default/web-1", &[429, 429]);
    let calls = Calls(Default::default());
    let metrics = Metrics::new();
    let t0 = tokio::time::Instant::now();
    let ok = evict_as_p(&api, &pod_ref("web-1", Some(3600)), &calls, &metrics).await;
    assert!(ok);
    assert_eq!(
        *calls.0.lock().unwrap(),
        vec![
            EvictionCall::Blocked,
            EvictionCall::Blocked,
            EvictionCall::Accepted
        ]
    );
    assert_eq!(t0.elapsed(), Duration::from_secs(20), "two waits of 10s");
    let evictions = api.requests("POST", "/pods/web-1/eviction");
    assert_eq!(evictions.len(), 3);
    assert_eq!(evictions[0].body["apiVersion"], "policy/v1");
    assert_eq!(evictions[0].body["kind"], "Eviction");
    let opts = &evictions[0].body["deleteOptions"];
    assert_eq!(opts["gracePeriodSeconds"], 60, "grace capped: {opts}");
    assert_eq!(opts["preconditions"]["uid"], "uid-default-web-1");
    let text = metrics.encode();
    assert!(
        text.contains("ebb_evictions_total{policy=\"p\",result=\"blocked_by_pdb\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("ebb_evictions_total{policy=\"p\",result=\"evicted\"} 1"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pdb_that_never_allows_gives_up_at_max_pod_eviction_time() {
    let api = FakeApi::new();
    api.add_pod(pod("db-0").on("n1").build());
    api.script_evictions("default/db-0", &[429; 100]);
    let calls = Calls(Default::default());
    let t0 = tokio::time::Instant::now();
    let metrics = Metrics::new();
    let ok = evict_as_p(&api, &pod_ref("db-0", None), &calls, &metrics).await;
    assert!(!ok);
    // Calls at 0, 10, ..., 120 s: 13 calls, then the next retry would pass 120 s.
    assert_eq!(calls.0.lock().unwrap().len(), 13);
    assert_eq!(t0.elapsed(), Duration::from_secs(120));
}

/// A drain paced by a budget that keeps moving is not stuck: each eviction the budget lets
/// through starts `maxPodEvictionTime` again for the pods waiting on it; once it stops moving,
/// they give up that long after its last move.
#[tokio::test(start_paused = true)]
async fn a_wait_for_a_budget_that_moves_starts_max_pod_eviction_time_again() {
    use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
    let api = FakeApi::new();
    for name in ["web-a", "web-b", "web-c"] {
        api.add_pod(
            pod(name)
                .on("n1")
                .label("app", "web")
                .owned_by_rs("web")
                .build(),
        );
    }
    // minAvailable 2 of 3 healthy: one disruption at a time.
    let mut budget = ebb_controller::testkit::pdb_min_available("web", "app", "web", 2);
    budget.status = Some(PodDisruptionBudgetStatus {
        observed_generation: Some(0),
        disruptions_allowed: 1,
        desired_healthy: 2,
        current_healthy: 3,
        expected_pods: 3,
        ..Default::default()
    });
    let pdbs = controller_fake::store_of::<PodDisruptionBudget>(vec![budget]);
    let (_pdb_tick, pdb_changes) = tokio::sync::watch::channel(0u64);
    let gate =
        DisruptionGate::new(api.pod_store(), api.pod_changes()).with_budgets(pdbs, pdb_changes);
    // web-b's eviction holds the one disruption; web-a waits for it.
    let Admission::Send(b) = gate.admit(&pod_ref("web-b", None)) else {
        panic!("the budget allows one eviction");
    };
    let calls = Calls(Default::default());
    let metrics = Metrics::new();
    let fence = Leadership::default();
    let in_flight = InFlight::default();
    let ev = Evictor {
        fence: &fence,
        client: api.client(),
        gate: &gate,
        in_flight: &in_flight,
        pacer: &Pacer::off(),
        drain: 0,
        metrics: &metrics,
        policy: "p",
        observer: &calls,
    };
    let t0 = tokio::time::Instant::now();
    let a = pod_ref("web-a", None);
    let cancel = CancellationToken::new();
    let settings = settings();
    let waiting = evict_with_retry(&ev, &a, &settings, &cancel);
    let moves = async {
        // At 85 s the budget lets web-b's eviction through (the caches still show it running,
        // so web-a still waits); then it moves no more.
        tokio::time::sleep(Duration::from_secs(85)).await;
        gate.settle(b, true);
        assert_eq!(gate.moved("default/web"), 1);
    };
    let (ok, ()) = tokio::join!(waiting, moves);
    assert!(!ok, "web-a gives up once the budget stops moving");
    // Seen moving at the 90 s check, web-a waits 120 s from there, not from its first try.
    assert_eq!(t0.elapsed(), Duration::from_secs(210));
    assert!(calls.0.lock().unwrap().is_empty(), "web-a was never sent");
    assert!(api.requests("POST", "/pods/web-a/eviction").is_empty());
}

#[tokio::test]
async fn taints_are_written_with_the_resource_version_and_conflicts_retried() {
    let api = FakeApi::new();
    let foreign = Taint {
        key: "dedicated".into(),
        value: Some("gpu".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    };
    api.add_node(node("n1").taint(foreign.clone()).build());
    api.conflict_next_node_patches(1);
    let tracker = Tracker::default();
    let actuator = Actuator::new(
        api.client(),
        api.stores(),
        api.pod_changes(),
        tracker,
        Metrics::new(),
    );
    let writer = actuator.node_writer();
    let now = jiff::Timestamp::from_second(1_700_000_000).unwrap();
    assert_eq!(
        writer
            .add_taint("n1", EbbTaint::Candidate, now)
            .await
            .unwrap(),
        Written::Changed
    );
    let patches = api.requests("PATCH", "/api/v1/nodes/n1");
    assert_eq!(patches.len(), 2, "one conflict, one success");
    assert_eq!(patches[1].body["metadata"]["resourceVersion"], "1");
    let n1 = api.node("n1").unwrap();
    let t = taints::taints_of(&n1);
    assert_eq!(t.len(), 2);
    assert_eq!(t[0], foreign);
    assert_eq!(t[1].key, "ebb.dev/deletion-candidate");
    assert_eq!(t[1].value.as_deref(), Some("1700000000"));
    assert_eq!(
        writer
            .add_taint("n1", EbbTaint::Candidate, now)
            .await
            .unwrap(),
        Written::Unchanged
    );
    assert_eq!(api.requests("PATCH", "/api/v1/nodes/n1").len(), 2);
    assert_eq!(
        writer
            .remove_taint("n1", EbbTaint::Candidate)
            .await
            .unwrap(),
        Written::Changed
    );
    assert_eq!(taints::taints_of(&api.node("n1").unwrap()), &[foreign]);
    assert_eq!(
        writer
            .remove_taint("gone", EbbTaint::Candidate)
            .await
            .unwrap(),
        Written::NotFound
    );
}

fn setup(api: &FakeApi) -> (Actuator, Tracker) {
    setup_with(api, Metrics::new())
}

/// [`setup`] counting into `metrics`.
fn setup_with(api: &FakeApi, metrics: Metrics) -> (Actuator, Tracker) {
    let tracker = Tracker::default();
    let actuator = Actuator::new(
        api.client(),
        api.stores(),
        api.pod_changes(),
        tracker.clone(),
        metrics,
    )
    .with_recheck_delay(Duration::from_secs(2));
    (actuator, tracker)
}

fn order(api: &FakeApi, node: &str, mode: ScaleDownMode) -> DrainOrder {
    DrainOrder {
        policy: "workers".into(),
        node: node.into(),
        kind: ScaleDownKind::underutilized,
        mode,
        settings: settings(),
        planned_pods: uids_on(node, api.pod_store().state().iter().map(|p| &**p)),
        resume_from: None,
        destinations: Default::default(),
        recheck: RecheckInputs::skipped(),
        cancel: CancellationToken::new(),
        target: None,
        group_min: 0,
        removal_timeout: Duration::from_secs(60),
    }
}

/// Starts `order`, which the actuator must accept and not find running already, and records it
/// as the policy's loop does right after starting drains (its status lists the drain).
async fn start(actuator: &Actuator, order: DrainOrder) -> JoinHandle<Outcome> {
    let node = order.node.clone();
    let handle = actuator.start(order).await.unwrap().unwrap();
    actuator.tracker().mark_recorded([node.as_str()]);
    handle
}

/// Runs `order` to its end.
async fn finish(actuator: &Actuator, order: DrainOrder) -> Outcome {
    start(actuator, order).await.await.unwrap()
}

/// Node `n1` with one ReplicaSet pod `name` that stays after its eviction is accepted.
fn node_with_lingering_pod(api: &FakeApi, name: &str) {
    api.add_node(node("n1").build());
    api.add_pod(pod(name).on("n1").owned_by("ReplicaSet", "s").build());
    *api.keep_evicted_pods.lock().unwrap() = true;
}

fn has_hard_taint(api: &FakeApi, name: &str) -> bool {
    api.node(name)
        .is_some_and(|n| taints::has(&n, EbbTaint::ToBeDeleted))
}

#[tokio::test(start_paused = true)]
async fn drain_and_delete_evicts_everything_then_deletes_the_node() {
    let api = FakeApi::new();
    api.add_node(node("n1").build());
    api.add_pod(pod("web-1").on("n1").owned_by("ReplicaSet", "web").build());
    api.add_pod(pod("web-2").on("n1").owned_by("ReplicaSet", "web").build());
    api.add_pod(pod("logs").on("n1").owned_by("DaemonSet", "logs").build());
    api.add_pod(pod("other").on("n2").build());
    api.script_evictions("default/web-2", &[429]);
    let (actuator, tracker) = setup(&api);
    let handle = actuator
        .start(order(&api, "n1", ScaleDownMode::DrainAndDelete))
        .await
        .unwrap()
        .expect("drain started");
    tracker.mark_recorded(["n1"]);
    assert!(has_hard_taint(&api, "n1"), "tainted synchronously by start");
    assert_eq!(tracker.in_flight(), BTreeSet::from(["n1".to_string()]));
    assert_eq!(handle.await.unwrap(), Outcome::Removed);
    assert!(api.node("n1").is_none(), "node deleted");
    let finished = tracker.take_finished("workers");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0].drain.evictions_blocked, 1);
    assert!(tracker.in_flight().is_empty());
    let evicted: BTreeSet<String> = tracker
        .take_evictions("workers")
        .into_iter()
        .map(|e| e.pod.name)
        .collect();
    assert_eq!(evicted, BTreeSet::from(["web-1".into(), "web-2".into()]));
    assert_eq!(api.requests("POST", "/pods/logs/eviction").len(), 1);
    assert!(api.requests("POST", "/pods/other/eviction").is_empty());
    // Order on the wire: taint, evictions, delete.
    let log = api.log();
    let first_evict = log.iter().position(|l| l.path.ends_with("/eviction"));
    let taint = log.iter().position(|l| l.method == "PATCH");
    let delete = log.iter().position(|l| l.method == "DELETE");
    assert!(taint < first_evict && first_evict < delete, "{log:#?}");
}

/// Drains of several nodes send no more eviction calls at once than the controller's bound, and
/// use all of it: an API server slow to answer gets no more calls than the bound.
#[tokio::test(start_paused = true)]
async fn evictions_in_flight_stay_within_the_controllers_bound() {
    let api = FakeApi::new();
    for n in ["n1", "n2", "n3"] {
        api.add_node(node(n).build());
        for i in 0..6 {
            let name = format!("{n}-web-{i}");
            api.add_pod(pod(&name).on(n).owned_by("ReplicaSet", "web").build());
        }
    }
    *api.eviction_latency.lock().unwrap() = Some(Duration::from_secs(1));
    let metrics = Metrics::new();
    let (actuator, tracker) = setup_with(&api, metrics.clone());
    let actuator = actuator.with_max_evictions_in_flight(5);
    // Three drains of 4 at once each would send 12 at once.
    let handles = futures::future::join_all(
        ["n1", "n2", "n3"].map(|n| start(&actuator, order(&api, n, ScaleDownMode::DrainAndDelete))),
    )
    .await;
    for h in handles {
        assert_eq!(h.await.unwrap(), Outcome::Removed);
    }
    assert_eq!(
        tracker.take_evictions("workers").len(),
        18,
        "every pod evicted"
    );
    assert_eq!(
        api.most_evictions_open(),
        5,
        "the bound, and all of it used"
    );
    assert_eq!(
        metrics.evictions_in_flight.get(),
        0,
        "every slot given back"
    );
}

/// Drains of two nodes send an eviction only while fewer than `--max-starting-replacements`
/// replacements of earlier evictions are not Running: a cluster slow to start pods gets no more
/// Pending replacements than the bound, and every pod still goes.
#[tokio::test(start_paused = true)]
async fn evictions_wait_while_the_bound_of_replacements_is_starting() {
    const LIMIT: usize = 2;
    // The replacements' node takes this long to start each one.
    const START: Duration = Duration::from_secs(4);
    let api = FakeApi::new();
    for n in ["n1", "n2", "n3"] {
        api.add_node(node(n).build());
    }
    for n in ["n1", "n2"] {
        for i in 0..3 {
            let name = format!("{n}-web-{i}");
            api.add_pod(pod(&name).on(n).owned_by("ReplicaSet", "web").build());
        }
    }
    let metrics = Metrics::new();
    let (actuator, tracker) = setup_with(&api, metrics.clone());
    let actuator = actuator.with_starting_replacements(LIMIT, LIMIT);
    let t0 = tokio::time::Instant::now();
    let drains = futures::future::join_all(
        ["n1", "n2"].map(|n| start(&actuator, order(&api, n, ScaleDownMode::DrainAndDelete))),
    );
    // The ReplicaSet: one replacement on n3 per accepted eviction, Running `START` later.
    let replica_set = async {
        let mut created: Vec<tokio::time::Instant> = Vec::new();
        let mut running = 0;
        let mut most_starting = 0;
        loop {
            let evicted = api
                .requests("POST", "/eviction")
                .into_iter()
                .filter(|l| l.path.contains("-web-"))
                .count();
            let now = tokio::time::Instant::now();
            while created.len() < evicted {
                let mut p = pod(&format!("web-r{}", created.len()))
                    .on("n3")
                    .owned_by("ReplicaSet", "web")
                    .phase("Pending")
                    .build();
                p.metadata.creation_timestamp = Some(Time(jiff::Timestamp::now()));
                api.add_pod(p);
                created.push(now);
            }
            for (i, at) in created.iter().enumerate().skip(running) {
                if now.duration_since(*at) < START {
                    break;
                }
                let mut p = pod(&format!("web-r{i}"))
                    .on("n3")
                    .owned_by("ReplicaSet", "web")
                    .build();
                p.metadata.creation_timestamp = Some(Time(jiff::Timestamp::now()));
                api.add_pod(p);
                running = i + 1;
            }
            assert!(
                evicted <= running + LIMIT,
                "{evicted} evicted with {running} replacements Running: more than {LIMIT} starting"
            );
            most_starting = most_starting.max(evicted - running);
            if running == 6 {
                return most_starting;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let (handles, most_starting) = tokio::join!(drains, replica_set);
    for h in handles {
        assert_eq!(h.await.unwrap(), Outcome::Removed);
    }
    assert_eq!(
        tracker.take_evictions("workers").len(),
        6,
        "every pod evicted"
    );
    assert_eq!(most_starting, LIMIT, "the bound, and all of it used");
    // Six replacements started two at a time: three rounds of the node's start time.
    assert!(t0.elapsed() >= 2 * START, "took {:?}", t0.elapsed());
    let paced = metrics
        .evictions
        .get_or_create(&ebb_controller::metrics::EvictionLabels {
            policy: "workers".into(),
            result: ebb_controller::metrics::EvictionResult::paced,
        })
        .get();
    assert!(paced >= 1, "the waits are counted");
    use ebb_controller::metrics::{StartTimeoutLabels, StartTimeoutReason as R};
    for reason in [
        R::namespace_not_starting,
        R::longest_start,
        R::longest_queued,
    ] {
        let timeouts = metrics
            .replacement_start_timeouts
            .get_or_create(&StartTimeoutLabels { reason })
            .get();
        assert_eq!(timeouts, 0, "{reason:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn drain_mode_keeps_the_node_cordoned_labelled_and_untainted() {
    let api = FakeApi::new();
    api.add_node(node("n1").build());
    api.add_pod(pod("web-1").on("n1").owned_by("ReplicaSet", "web").build());
    let (actuator, _) = setup(&api);
    let handle = start(&actuator, order(&api, "n1", ScaleDownMode::Drain)).await;
    assert_eq!(handle.await.unwrap(), Outcome::Removed);
    let n1 = api.node("n1").expect("node kept");
    assert_eq!(n1.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(n1.metadata.labels.as_ref().unwrap()[LABEL_DRAINED], "true");
    assert!(!taints::has(&n1, EbbTaint::ToBeDeleted));
}

#[tokio::test(start_paused = true)]
async fn a_pod_landing_after_the_plan_rolls_the_drain_back() {
    let api = FakeApi::new();
    api.add_node(node("n1").build());
    api.add_pod(pod("web-1").on("n1").build());
    let (actuator, tracker) = setup(&api);
    let o = order(&api, "n1", ScaleDownMode::DrainAndDelete);
    // The pod arrives between the plan and the taint.
    api.add_pod(pod("late").ns("shop").on("n1").build());
    let outcome = finish(&actuator, o).await;
    assert_eq!(
        outcome,
        Outcome::GaveUp(GiveUpReason::PodsLanded(vec!["shop/late".into()]))
    );
    assert!(api.node("n1").is_some());
    assert!(!has_hard_taint(&api, "n1"), "rolled back");
    assert!(
        api.requests("POST", "/eviction").is_empty(),
        "nothing evicted"
    );
    assert!(tracker.in_flight().is_empty());
}

/// A drain keeps its loop's planner state only until its re-check: the drains of a wave run for
/// minutes after it, and each loop's copy held until then took hundreds of MiB at 5,000 nodes.
#[tokio::test(start_paused = true)]
async fn a_drain_lets_go_of_its_loops_planner_state_once_rechecked() {
    let api = FakeApi::new();
    node_with_lingering_pod(&api, "stuck");
    let (actuator, tracker) = setup(&api);
    let state = std::sync::Arc::new(ebb_controller::scaledown::PlannerState::default());
    let mut o = order(&api, "n1", ScaleDownMode::DrainAndDelete);
    o.recheck.state = state.clone();
    let handle = start(&actuator, o).await;
    assert_eq!(
        std::sync::Arc::strong_count(&state),
        2,
        "the order holds the state until its re-check"
    );
    // Past the re-check delay (2 s), the pod evicted and lingering: the drain waits for it.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        tracker.get("n1").map(|d| d.phase),
        Some(ebb_api::reasons::DrainPhase::WaitingForPods),
        "the drain is still running"
    );
    assert_eq!(
        std::sync::Arc::strong_count(&state),
        1,
        "the running drain no longer holds the state"
    );
    handle.abort();
}

#[tokio::test(start_paused = true)]
async fn the_planner_recheck_can_veto_the_drain() {
    let api = FakeApi::new();
    api.add_node(node("n1").build());
    let (actuator, _) = setup(&api);
    // A pod without a controller landed before the plan saw it: the planner, re-run on the
    // shared model for n1 alone, keeps the node.
    api.add_pod(pod("bare").on("n1").build());
    let mut o = order(&api, "n1", ScaleDownMode::DrainAndDelete);
    o.recheck = RecheckInputs::new(Default::default(), Default::default());
    let outcome = finish(&actuator, o).await;
    assert!(
        matches!(outcome, Outcome::GaveUp(GiveUpReason::NoLongerRemovable(ref w)) if w.to_string().contains("BlockedByPod")),
        "{outcome:?}"
    );
    assert!(!has_hard_taint(&api, "n1"));
    assert!(api.node("n1").is_some());
}

#[tokio::test(start_paused = true)]
async fn evictions_refused_past_the_max_time_untaint_the_node() {
    let api = FakeApi::new();
    api.add_node(node("n1").build());
    api.add_pod(pod("db-0").on("n1").owned_by("StatefulSet", "db").build());
    api.add_pod(pod("web-1").on("n1").owned_by("ReplicaSet", "web").build());
    api.script_evictions("default/db-0", &[429; 100]);
    let (actuator, tracker) = setup(&api);
    let outcome = finish(&actuator, order(&api, "n1", ScaleDownMode::DrainAndDelete)).await;
    assert_eq!(
        outcome,
        Outcome::GaveUp(GiveUpReason::EvictionTimeout {
            pods: vec!["default/db-0".into()]
        })
    );
    assert!(!has_hard_taint(&api, "n1"));
    assert!(api.node("n1").is_some());
    assert!(api.requests("DELETE", "/nodes/").is_empty());
    let finished = tracker.take_finished("workers");
    assert!(finished[0].drain.evictions_blocked >= 12);
}

#[tokio::test(start_paused = true)]
async fn pods_that_never_terminate_fail_the_drain_after_their_grace() {
    let api = FakeApi::new();
    node_with_lingering_pod(&api, "stuck");
    let (actuator, _) = setup(&api);
    let t0 = tokio::time::Instant::now();
    let outcome = finish(&actuator, order(&api, "n1", ScaleDownMode::DrainAndDelete)).await;
    assert_eq!(
        outcome,
        Outcome::GaveUp(GiveUpReason::PodsDidNotTerminate {
            pods: vec!["default/stuck".into()]
        })
    );
    // re-check delay (2s) + grace cap (60s) + slack (30s)
    assert_eq!(t0.elapsed(), Duration::from_secs(92));
    assert!(!has_hard_taint(&api, "n1"));
}

/// A node goes only once a written status of its policy lists its drain (so a process started
/// after the removal counts it), or after [`RECORDED_TIMEOUT`] when no status can be written.
#[tokio::test(start_paused = true)]
async fn a_node_goes_once_a_written_status_lists_its_drain() {
    let api = FakeApi::new();
    api.add_node(node("n1").build());
    api.add_node(node("n2").build());
    let (actuator, tracker) = setup(&api);
    let t0 = tokio::time::Instant::now();
    let one = actuator
        .start(order(&api, "n1", ScaleDownMode::DrainAndDelete))
        .await
        .unwrap()
        .unwrap();
    let two = actuator
        .start(order(&api, "n2", ScaleDownMode::DrainAndDelete))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        api.node("n1").is_some() && api.node("n2").is_some(),
        "no node goes before a status lists its drain"
    );
    tracker.mark_recorded(["n1"]);
    assert_eq!(one.await.unwrap(), Outcome::Removed);
    assert_eq!(t0.elapsed(), Duration::from_secs(10), "at once when listed");
    assert!(api.node("n2").is_some(), "n2's drain is not listed");
    assert_eq!(two.await.unwrap(), Outcome::Removed);
    assert_eq!(
        t0.elapsed(),
        Duration::try_from(ebb_controller::scaledown::eligibility::ARRIVAL_WINDOW).unwrap()
            + RECORDED_TIMEOUT,
        "unlisted: removed all the same after the bound, counted from the end of the arrival window"
    );
    assert!(api.node("n2").is_none());
}

#[tokio::test(start_paused = true)]
async fn waiting_ends_as_soon_as_the_watch_sees_the_pods_go() {
    let api = FakeApi::new();
    node_with_lingering_pod(&api, "slow");
    let (actuator, _) = setup(&api);
    let t0 = tokio::time::Instant::now();
    let handle = start(&actuator, order(&api, "n1", ScaleDownMode::DrainAndDelete)).await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(api.node("n1").is_some(), "still waiting for the pod");
    api.remove_pod("default", "slow");
    assert_eq!(handle.await.unwrap(), Outcome::Removed);
    assert_eq!(t0.elapsed(), Duration::from_secs(7));
    assert!(api.node("n1").is_none());
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_drain_rolls_it_back() {
    let api = FakeApi::new();
    api.add_node(node("n1").build());
    api.add_pod(pod("web-1").on("n1").build());
    api.script_evictions("default/web-1", &[429; 100]);
    let (actuator, _) = setup(&api);
    let o = order(&api, "n1", ScaleDownMode::DrainAndDelete);
    let cancel = o.cancel.clone();
    let handle = start(&actuator, o).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(has_hard_taint(&api, "n1"));
    cancel.cancel();
    assert_eq!(
        handle.await.unwrap(),
        Outcome::GaveUp(GiveUpReason::Cancelled)
    );
    assert!(!has_hard_taint(&api, "n1"));
}

/// A stop (SIGTERM) while a drain waits out its arrival window, past its last eviction: the
/// drain finishes within the shutdown bound and the node goes; it is not rolled back.
#[tokio::test(start_paused = true)]
async fn a_stop_in_the_arrival_window_lets_the_drain_finish() {
    let api = FakeApi::new();
    api.add_node(node("n1").build());
    let (actuator, _) = setup(&api);
    let stop = CancellationToken::new();
    let actuator = actuator.with_stop(stop.clone());
    let mut o = order(&api, "n1", ScaleDownMode::DrainAndDelete);
    // As the controller gives them: every policy's drains are cancelled with its stop.
    o.cancel = stop.child_token();
    let handle = start(&actuator, o).await;
    // The re-check takes 2 s here; the arrival window runs 5 s from the taint.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(
        api.node("n1").is_some(),
        "still waiting out its arrival window"
    );
    stop.cancel();
    assert_eq!(handle.await.unwrap(), Outcome::Removed);
    assert!(api.node("n1").is_none(), "the node went");
}

#[tokio::test(start_paused = true)]
async fn a_resumed_drain_keeps_its_taint_and_start_time() {
    let api = FakeApi::new();
    let started = jiff::Timestamp::from_second(1_600_000_000).unwrap();
    api.add_node(node("n1").taint(EbbTaint::ToBeDeleted.at(started)).build());
    let (actuator, tracker) = setup(&api);
    let mut o = order(&api, "n1", ScaleDownMode::DrainAndDelete);
    o.resume_from = Some(started);
    let handle = start(&actuator, o).await;
    assert_eq!(tracker.get("n1").unwrap().started, started);
    assert!(
        api.requests("PATCH", "/nodes/n1").is_empty(),
        "no new taint"
    );
    assert_eq!(handle.await.unwrap(), Outcome::Removed);
    assert!(api.node("n1").is_none());
}

#[tokio::test]
async fn dry_run_never_starts_a_drain() {
    let api = FakeApi::new();
    api.add_node(node("n1").build());
    let (actuator, _) = setup(&api);
    assert!(
        actuator
            .start(order(&api, "n1", ScaleDownMode::DryRun))
            .await
            .is_err()
    );
    assert!(api.log().is_empty(), "nothing written");
    let n1 = api.node("n1").unwrap();
    assert!(!taints::has(&n1, EbbTaint::ToBeDeleted));
    assert!(
        !n1.spec
            .unwrap()
            .taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == TAINT_TO_BE_DELETED)
    );
}
