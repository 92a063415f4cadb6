//! Candidacy is capacity; PodDisruptionBudgets pace which candidates start draining.

use std::collections::BTreeMap;

use crate::cluster::CachedPod;
use ebb_api::reasons::ThrottledReason;
use jiff::Timestamp;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use proptest::prelude::*;

use std::collections::BTreeSet;

use super::budgets::{InFlight, Limits, Removable, Selection, select};
use super::config::PlannerConfig;
use super::pdb::{Needs, PdbPacing};
use super::{PlannerState, StepStopwatch, plan, select_deletions};
use crate::cluster::{ClusterObjects, PredicateChecker, build_snapshot};
use crate::testkit::{PodBuilder, config_selecting, node, objects, pdb_min_available, pod, taint};
use ebb_api::names::TAINT_TO_BE_DELETED;

fn t(min: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + min * 60).unwrap()
}

fn web(name: &str, node: &str) -> PodBuilder {
    pod(name)
        .on(node)
        .cpu("1")
        .label("app", "web")
        .owned_by_rs("web")
}

/// Plans and selects (unneeded time ignored) on `objs` with `state`.
fn select_now(objs: &ClusterObjects, cfg: &PlannerConfig, state: &mut PlannerState) -> Selection {
    select_now_draining(objs, cfg, state, &[])
}

/// [`select_now`] with the actuator draining `draining`.
fn select_now_draining(
    objs: &ClusterObjects,
    cfg: &PlannerConfig,
    state: &mut PlannerState,
    draining: &[&str],
) -> Selection {
    let mut snap = build_snapshot(objs).unwrap();
    let in_flight: BTreeSet<String> = draining.iter().map(|n| n.to_string()).collect();
    let p = plan(
        &mut snap,
        &mut PredicateChecker::new(),
        cfg,
        t(0),
        state,
        &in_flight,
        &mut StepStopwatch::default(),
    );
    select_deletions(&snap, &p, state, cfg, t(0), true)
}

/// `big` (16 cpu, 9 used: not underutilised) takes the pods of `a`, `b` and `c` (1 cpu each).
fn three_small() -> ClusterObjects {
    objects(
        [
            node("big").cpu("16"),
            node("a").cpu("8"),
            node("b").cpu("8"),
            node("c").cpu("8"),
        ],
        [
            pod("filler").on("big").cpu("9").owned_by_rs("filler"),
            web("w1", "a"),
            web("w2", "b"),
            web("w3", "c"),
        ],
    )
}

fn held(sel: &Selection) -> Vec<(&str, &str)> {
    sel.held_by_pdb
        .iter()
        .map(|(n, p)| (n.as_str(), p.as_str()))
        .collect()
}

#[test]
fn a_budget_paces_the_drains_but_every_node_stays_a_candidate() {
    let mut objs = three_small();
    // 3 healthy, at least 2 available: one disruption allowed.
    objs.pdbs.push(pdb_min_available("web", "app", "web", 2));
    let cfg = PlannerConfig::default();
    let mut state = PlannerState::default();
    let sel = select_now(&objs, &cfg, &mut state);
    assert_eq!(
        state.candidates.keys().collect::<Vec<_>>(),
        ["a", "b", "c"],
        "candidacy is about capacity only"
    );
    assert_eq!(sel.drain, ["a"]);
    assert_eq!(held(&sel), [("b", "default/web"), ("c", "default/web")]);
    assert!(
        sel.throttled
            .iter()
            .all(|(_, r)| *r == ThrottledReason::WaitingForDisruptionBudget)
    );
}

#[test]
fn a_drain_in_flight_keeps_its_disruptions_until_the_replacement_is_ready() {
    let mut objs = three_small();
    objs.pdbs.push(pdb_min_available("web", "app", "web", 2));
    let cfg = PlannerConfig::default();
    let mut state = PlannerState::default();
    select_now(&objs, &cfg, &mut state);
    // Started, its pod not evicted yet: the pod's disruption is spoken for.
    let sel = select_now_draining(&objs, &cfg, &mut state, &["a"]);
    assert!(sel.drain.is_empty(), "{sel:?}");
    assert_eq!(held(&sel), [("b", "default/web"), ("c", "default/web")]);

    // Evicted; the cache still shows the pod running and ready (the watch lags), and the
    // budget's own status is computed from it: the eviction still counts.
    let evicted: CachedPod = web("w1", "a").build();
    state.record_eviction(std::sync::Arc::new(evicted), t(0));
    let sel = select_now_draining(&objs, &cfg, &mut state, &["a"]);
    assert!(sel.drain.is_empty(), "{sel:?}");

    // Gone, its replacement running on `big` but not ready yet: still nothing.
    objs.pods
        .retain(|p| p.metadata.name.as_deref() != Some("w1"));
    objs.pods.push(web("w1-new", "big").not_ready().build());
    let sel = select_now_draining(&objs, &cfg, &mut state, &["a"]);
    assert!(sel.drain.is_empty(), "{sel:?}");

    // Ready: the next drain starts.
    objs.pods
        .retain(|p| p.metadata.name.as_deref() != Some("w1-new"));
    objs.pods.push(web("w1-new", "big").build());
    let sel = select_now_draining(&objs, &cfg, &mut state, &["a"]);
    assert_eq!(sel.drain, ["b"], "{sel:?}");
}

/// Nodes of an earlier wave, drained and tainted `to-be-deleted`: while ebb still removes them
/// they count against `maxScaleDownParallelism`; once the API server accepted their deletion and
/// their provider finishes them (a finalizer holds the Node), the next wave starts.
#[test]
fn nodes_handed_off_to_their_provider_leave_the_parallelism_free() {
    let wave = |deleting: bool| {
        let mut objs = three_small();
        for i in 0..2 {
            let n = node(&format!("old-{i}")).cpu("8").taint(taint(
                TAINT_TO_BE_DELETED,
                "1",
                "NoSchedule",
            ));
            objs.nodes
                .push(if deleting { n.deleting() } else { n }.build());
        }
        objs
    };
    let mut cfg = PlannerConfig::default();
    cfg.limits.max_scale_down_parallelism = 2;
    cfg.limits.max_drain_parallelism = 2;

    let mut state = PlannerState::default();
    let sel = select_now(&wave(false), &cfg, &mut state);
    assert!(sel.drain.is_empty(), "{sel:?}");
    assert!(
        sel.throttled
            .iter()
            .all(|(_, r)| *r == ThrottledReason::MaxScaleDownParallelism),
        "{sel:?}"
    );

    let mut state = PlannerState::default();
    let sel = select_now(&wave(true), &cfg, &mut state);
    assert_eq!(sel.drain.len(), 2, "{sel:?}");
}

/// A budget's status as the disruption controller writes it.
fn with_status(
    mut pdb: PodDisruptionBudget,
    allowed: i32,
    desired: i32,
    disrupted: &[&str],
) -> PodDisruptionBudget {
    pdb.status = Some(PodDisruptionBudgetStatus {
        observed_generation: Some(0),
        disruptions_allowed: allowed,
        desired_healthy: desired,
        current_healthy: desired + allowed,
        expected_pods: desired + allowed,
        disrupted_pods: (!disrupted.is_empty()).then(|| {
            disrupted
                .iter()
                .map(|p| {
                    (
                        p.to_string(),
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(0)),
                    )
                })
                .collect()
        }),
        conditions: None,
    });
    pdb
}

#[test]
fn the_lower_of_the_status_and_the_pods_is_what_a_budget_allows() {
    let cfg = PlannerConfig::default();
    // The status allows 2, but the API server has recorded w1 as disrupted (the disruption
    // controller has not processed it yet): w2 and w3 are healthy, 1 must stay, 1 may go.
    // Node `a` costs nothing (its pod is already counted as disrupted).
    let mut objs = three_small();
    objs.pdbs.push(with_status(
        pdb_min_available("web", "app", "web", 1),
        2,
        1,
        &["w1"],
    ));
    let sel = select_now(&objs, &cfg, &mut PlannerState::default());
    assert_eq!(sel.drain, ["a", "b"], "{sel:?}");
    assert_eq!(held(&sel), [("c", "default/web")]);

    // The status allows 0 (the disruption controller has not seen a replacement yet) although
    // every pod looks healthy: the API server would refuse, so nothing starts.
    let mut objs = three_small();
    objs.pdbs.push(with_status(
        pdb_min_available("web", "app", "web", 2),
        0,
        2,
        &[],
    ));
    let sel = select_now(&objs, &cfg, &mut PlannerState::default());
    assert!(sel.drain.is_empty(), "{sel:?}");
    assert_eq!(held(&sel).len(), 3);
}

#[test]
fn a_node_holding_more_pods_of_a_budget_than_it_allows_drains_alone() {
    // A StatefulSet of 3 with minAvailable 2 (n-1): one disruption at a time, and node `a`
    // holds two of its pods.
    let db = |name: &str, node: &str, cpu: &str| {
        pod(name)
            .on(node)
            .cpu(cpu)
            .label("app", "db")
            .owned_by("StatefulSet", "db")
    };
    let mut objs = objects(
        [
            node("big").cpu("16"),
            node("a").cpu("8"),
            node("c").cpu("8"),
        ],
        [
            pod("filler").on("big").cpu("9").owned_by_rs("filler"),
            db("db-0", "a", "1"),
            db("db-1", "a", "1"),
            db("db-2", "c", "3"),
        ],
    );
    objs.pdbs.push(pdb_min_available("db", "app", "db", 2));
    let cfg = PlannerConfig::default();
    let mut state = PlannerState::default();
    let sel = select_now(&objs, &cfg, &mut state);
    // `a` (less utilised) comes first; it needs 2 of 1 and goes alone.
    assert_eq!(sel.drain, ["a"], "{sel:?}");
    assert_eq!(held(&sel), [("c", "default/db")]);
    // With `a` in flight, `c` waits even though it needs only one.
    let sel = select_now_draining(&objs, &cfg, &mut state, &["a"]);
    assert!(sel.drain.is_empty());
    assert_eq!(held(&sel), [("c", "default/db")]);
}

#[test]
fn every_budget_over_a_pod_must_allow_its_disruption() {
    let cfg = PlannerConfig::default();
    let mut objs = three_small();
    objs.pdbs.push(pdb_min_available("web", "app", "web", 1)); // allows 2
    objs.pdbs
        .push(pdb_min_available("web-strict", "app", "web", 3)); // allows 0
    let sel = select_now(&objs, &cfg, &mut PlannerState::default());
    assert!(sel.drain.is_empty(), "{sel:?}");
    assert_eq!(
        held(&sel),
        [
            ("a", "default/web-strict"),
            ("b", "default/web-strict"),
            ("c", "default/web-strict")
        ]
    );
    // Both loose: the tighter of the two (2 of web, 3 of web-loose) paces.
    let mut objs = three_small();
    objs.pdbs.push(pdb_min_available("web", "app", "web", 1));
    objs.pdbs
        .push(pdb_min_available("web-loose", "app", "web", 0));
    let sel = select_now(&objs, &cfg, &mut PlannerState::default());
    assert_eq!(sel.drain, ["a", "b"]);
    assert_eq!(held(&sel), [("c", "default/web")]);
}

#[test]
fn pods_of_a_budget_outside_the_policy_count_too() {
    let cfg = config_selecting("pool", "p");
    let cluster = |outside_ready: bool| {
        let outside = web("w0", "other");
        let mut objs = objects(
            [
                node("big").cpu("16").label("pool", "p"),
                node("a").cpu("8").label("pool", "p"),
                node("b").cpu("8").label("pool", "p"),
                node("other").cpu("8"),
            ],
            [
                pod("filler").on("big").cpu("9").owned_by_rs("filler"),
                if outside_ready {
                    outside
                } else {
                    outside.not_ready()
                },
                web("w1", "a"),
                web("w2", "b"),
            ],
        );
        objs.pdbs.push(pdb_min_available("web", "app", "web", 2));
        objs
    };
    // The pod on `other` (not governed) is healthy: 3 healthy, 2 must stay, 1 may go.
    let sel = select_now(&cluster(true), &cfg, &mut PlannerState::default());
    assert_eq!(sel.drain, ["a"]);
    assert_eq!(held(&sel), [("b", "default/web")]);
    // Unready outside the policy: 2 healthy of 2, nothing may go.
    let sel = select_now(&cluster(false), &cfg, &mut PlannerState::default());
    assert!(sel.drain.is_empty(), "{sel:?}");
    assert_eq!(held(&sel).len(), 2);
}

/// ebb's own controller replicas, with the chart's PodDisruptionBudget (`minAvailable: 1` over
/// the two replicas): a node running one replica drains only while the other is Ready, and two
/// such nodes never drain at once.
#[test]
fn a_node_running_an_ebb_controller_replica_drains_only_while_the_other_is_ready() {
    let cfg = PlannerConfig::default();
    let cluster = |other_ready: bool| {
        let replica = |name: &str, node: &str| {
            pod(name)
                .on(node)
                .cpu("100m")
                .label("app.kubernetes.io/component", "controller")
                .owned_by_rs("ebb-controller")
        };
        let other = replica("ctl-2", "b");
        let mut objs = objects(
            [
                node("big").cpu("16"),
                node("a").cpu("8"),
                node("b").cpu("8"),
            ],
            [
                pod("filler").on("big").cpu("9").owned_by_rs("filler"),
                replica("ctl-1", "a"),
                if other_ready {
                    other
                } else {
                    other.not_ready()
                },
            ],
        );
        objs.pdbs.push(pdb_min_available(
            "ebb-controller",
            "app.kubernetes.io/component",
            "controller",
            1,
        ));
        objs
    };
    // Both Ready: one of the two nodes drains, the other waits for the replacement.
    let sel = select_now(&cluster(true), &cfg, &mut PlannerState::default());
    assert_eq!(sel.drain, ["a"]);
    assert_eq!(held(&sel), [("b", "default/ebb-controller")]);
    // The replica on b is not Ready: a runs the only Ready one and is held; b may go (its pod
    // takes no disruption: the budget counts only Ready pods, and a's stays).
    let sel = select_now(&cluster(false), &cfg, &mut PlannerState::default());
    assert_eq!(sel.drain, ["b"], "{sel:?}");
    assert_eq!(held(&sel), [("a", "default/ebb-controller")]);
}

#[test]
fn empty_nodes_and_pods_without_budgets_are_not_paced() {
    let cfg = PlannerConfig::default();
    let mut objs = objects(
        [
            node("big").cpu("16"),
            node("a").cpu("8"),
            node("b").cpu("8"),
            node("e").cpu("8"),
        ],
        [
            pod("filler").on("big").cpu("9").owned_by_rs("filler"),
            web("w1", "a"),
            pod("x").on("b").cpu("1").owned_by_rs("x"),
        ],
    );
    objs.pdbs.push(pdb_min_available("web", "app", "web", 1)); // allows 0
    let sel = select_now(&objs, &cfg, &mut PlannerState::default());
    assert_eq!(sel.empty, ["e"]);
    assert_eq!(sel.drain, ["b"]);
    assert_eq!(held(&sel), [("a", "default/web")]);
}

#[test]
fn the_selection_says_when_the_next_candidate_is_due() {
    let mut objs = three_small();
    objs.pdbs.push(pdb_min_available("web", "app", "web", 0));
    let cfg = PlannerConfig::default(); // unneededTime 10 min
    let mut state = PlannerState::default();
    let mut snap = build_snapshot(&objs).unwrap();
    let p = plan(
        &mut snap,
        &mut PredicateChecker::new(),
        &cfg,
        t(0),
        &mut state,
        &Default::default(),
        &mut StepStopwatch::default(),
    );
    let sel = select_deletions(&snap, &p, &state, &cfg, t(3), false);
    assert!(sel.drain.is_empty());
    assert_eq!(sel.waiting.len(), 3);
    assert_eq!(sel.next_due, Some(t(0) + cfg.limits.unneeded_time));
    let sel = select_deletions(&snap, &p, &state, &cfg, t(10), false);
    assert_eq!(sel.drain.len(), 3);
    assert_eq!(sel.next_due, None);
}

// ---- the pacing property ------------------------------------------------------------------

fn limits() -> Limits {
    Limits {
        max_scale_down_parallelism: 1000,
        max_drain_parallelism: 1000,
        unneeded_time: jiff::SignedDuration::ZERO,
        unready_time: jiff::SignedDuration::ZERO,
        min_nodes_per_group: 0,
        annotated_group_min: true,
    }
}

/// Needs of one node: up to 3 budgets, 0 to 3 pods each.
fn needs_strategy(budgets: usize) -> impl Strategy<Value = Needs> {
    proptest::collection::btree_map(0..budgets, 0i64..4, 0..=budgets)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the budgets and the nodes' pods, the drains in flight plus those started never
    /// need more disruptions of a budget than it allows, except one drain alone on a budget
    /// (which evicts as the budget allows); and a candidate held back names a budget that
    /// really lacks room.
    #[test]
    fn drains_never_need_more_than_the_budgets_allow(
        allowance in proptest::collection::vec(0i64..5, 3),
        in_flight in proptest::collection::vec(needs_strategy(3), 0..4),
        candidates in proptest::collection::vec(needs_strategy(3), 0..8),
    ) {
        let mut pacing = PdbPacing {
            names: (0..3).map(|i| format!("ns/pdb-{i}")).collect(),
            remaining: allowance.clone(),
            claimed: vec![false; 3],
            allowance: allowance.clone(),
        };
        // In flight: started by earlier selections under the same rule.
        let mut running: Vec<Needs> = Vec::new();
        for n in in_flight {
            if pacing.holds(&n).is_none() {
                pacing.take(&n);
                running.push(n);
            }
        }
        let removable: Vec<Removable> = candidates
            .iter()
            .enumerate()
            .map(|(i, n)| Removable {
                node: format!("n{i}"),
                empty: false,
                ready: true,
                since: t(0),
                group: None,
                group_min: 0,
                needs: n.clone(),
                saving: None,
            })
            .collect();
        let in_flight = InFlight { drains: running.len() as i64, pdbs: pacing, ..Default::default() };
        let sel = select(&removable, &in_flight, &limits(), &Default::default(), t(1), &BTreeMap::from([(None, 100)]), 100, false);
        let started: Vec<&Needs> = sel.drain.iter().map(|n| &candidates[n[1..].parse::<usize>().unwrap()]).collect();
        let draining: Vec<&Needs> = running.iter().chain(started.iter().copied()).collect();
        for (i, &allowed) in allowance.iter().enumerate() {
            let users: Vec<i64> = draining.iter().filter_map(|n| n.get(&i).copied().filter(|c| *c > 0)).collect();
            let total: i64 = users.iter().sum();
            prop_assert!(
                total <= allowed || (users.len() == 1 && allowed >= 1),
                "budget {i} allows {allowed}, drains need {users:?}"
            );
        }
        for (node, pdb) in &sel.held_by_pdb {
            let i: usize = pdb["ns/pdb-".len()..].parse().unwrap();
            let need = candidates[node[1..].parse::<usize>().unwrap()][&i];
            let used: i64 = draining.iter().filter_map(|n| n.get(&i)).sum();
            prop_assert!(need > 0 && used + need > allowance[i], "{node} held by {pdb} with room");
        }
        // Nothing is both started and held, and every candidate is accounted for.
        prop_assert_eq!(sel.drain.len() + sel.throttled.len(), candidates.len());
    }
}
