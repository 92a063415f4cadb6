//! Scenarios of the seed document run through the planner loop.

use std::time::Duration;

use ebb_api::reasons::UnremovableReason;
use jiff::Timestamp;

use super::config::PlannerConfig;
use super::{Plan, PlannerState, StepStopwatch, Unremovable, plan};
use crate::cluster::{ClusterObjects, ClusterSnapshot, PredicateChecker, build_snapshot};
use crate::testkit::{
    PodBuilder, config_selecting, node, node_state_warm, objects, pod, snapshot, taint,
};

fn t(min: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + min * 60).unwrap()
}

fn run(
    s: &mut ClusterSnapshot,
    cfg: &PlannerConfig,
    now: Timestamp,
    state: &mut PlannerState,
) -> Plan {
    run_timed(s, cfg, now, state, &mut StepStopwatch::default())
}

/// [`run`] with the stopwatch given.
fn run_timed(
    s: &mut ClusterSnapshot,
    cfg: &PlannerConfig,
    now: Timestamp,
    state: &mut PlannerState,
    watch: &mut StepStopwatch,
) -> Plan {
    plan(
        s,
        &mut PredicateChecker::new(),
        cfg,
        now,
        state,
        &Default::default(),
        watch,
    )
}

fn names(p: &Plan) -> Vec<&str> {
    p.candidates.iter().map(|c| c.node.as_str()).collect()
}

fn reason_of<'a>(p: &'a Plan, node: &str) -> Option<&'a Unremovable> {
    p.unremovable.iter().find(|u| u.node == node)
}

/// `big` (10 cpu, 6 used by `w0`) and `n` (10 cpu, `n_cpu` used by `w1`), both pods of `web`.
fn big_and_n(n_cpu: &str) -> ClusterObjects {
    objects(
        [node("big").cpu("10"), node("n").cpu("10")],
        [web("w0", "big", "6"), web("w1", "n", n_cpu)],
    )
}

fn web(name: &str, node: &str, cpu: &str) -> PodBuilder {
    pod(name)
        .on(node)
        .cpu(cpu)
        .label("app", "web")
        .owned_by_rs("web")
}

#[test]
fn candidates_are_removable_together() {
    // big has 4 cpu free; s1 and s2 need 3 each, s3 needs 1: s3 and one of s1, s2 fit at once.
    let mut s = snapshot(
        [
            node("big").cpu("10"),
            node("s1").cpu("8"),
            node("s2").cpu("8"),
            node("s3").cpu("8"),
        ],
        [
            web("w0", "big", "6"),
            web("w1", "s1", "3"),
            web("w2", "s2", "3"),
            web("w3", "s3", "1"),
        ],
    );
    // At 0.5 big (6 of 10) is busy and only a destination.
    let cfg = PlannerConfig {
        utilization_threshold: 0.5,
        ..PlannerConfig::default()
    };
    let p = run(&mut s, &cfg, t(0), &mut PlannerState::default());
    // Least utilised first: s3 (1/8) then s1, s2 (3/8). s3's pod goes to big (fullest).
    assert_eq!(names(&p), ["s3", "s1"]);
    let s2 = reason_of(&p, "s2").unwrap();
    assert_eq!(s2.reason, UnremovableReason::NoPlaceToMovePods);
    assert_eq!(s2.pod.as_deref(), Some("default/w2"));
    assert_eq!(
        reason_of(&p, "big").unwrap().reason,
        UnremovableReason::NotUnderutilized
    );
    for c in &p.candidates {
        assert_eq!(c.moves.len(), 1);
        assert_eq!(&*c.moves[0].to, "big");
    }
    // The snapshot is left as it was.
    assert_eq!(s.requested(s.node_id("big").unwrap()).cpu_milli, 6000);
}

#[test]
fn destinations_without_soft_taints_come_before_fuller_ones() {
    // full is the fullest node that fits, but carries a PreferNoSchedule taint (as a node
    // being retired, or one of ebb's deletion candidates, does): the scheduler would put the
    // pod on the untainted, emptier node, so the plan does too.
    let nodes = |soft: bool| {
        let full = node("full").cpu("10");
        [
            if soft {
                full.taint(taint("retiring", "true", "PreferNoSchedule"))
            } else {
                full
            },
            node("roomy").cpu("100"),
            node("src").cpu("10"),
        ]
    };
    let pods = || {
        [
            web("w0", "full", "8"),
            web("w1", "roomy", "60"),
            web("m", "src", "1"),
        ]
    };
    // At 0.7 full (8 of 10) and roomy (60 of 100, its pod fits nowhere) stay; src goes.
    let cfg = PlannerConfig {
        utilization_threshold: 0.7,
        ..PlannerConfig::default()
    };
    let dest = |soft: bool| {
        let mut s = snapshot(nodes(soft), pods());
        let p = run(&mut s, &cfg, t(0), &mut PlannerState::default());
        assert_eq!(names(&p), ["src"]);
        p.candidates[0].moves[0].to.to_string()
    };
    assert_eq!(dest(true), "roomy");
    assert_eq!(
        dest(false),
        "full",
        "without the taint, the fullest node wins"
    );
}

#[test]
fn hints_are_tried_first_and_age_out() {
    let nodes = || {
        [
            node("x").cpu("10"),
            node("y").cpu("10"),
            node("src").cpu("10"),
        ]
    };
    let mut s = snapshot(
        nodes(),
        [
            web("wx", "x", "6"),
            web("wy", "y", "5"),
            web("m", "src", "1"),
        ],
    );
    let cfg = PlannerConfig::default();
    let mut state = PlannerState::default();
    let p = run(&mut s, &cfg, t(0), &mut state);
    assert_eq!(&*p.candidates[0].moves[0].to, "x", "fullest node first");
    assert_eq!(state.hints.get("src", "uid-default-m"), Some("x"));
    // Now y is fuller than x: a fresh search would pick y, the hint keeps x.
    let mut s = snapshot(
        nodes(),
        [
            web("wx", "x", "6"),
            web("wy", "y", "7"),
            web("m", "src", "1"),
        ],
    );
    let p = run(&mut s, &cfg, t(1), &mut state);
    assert_eq!(&*p.candidates[0].moves[0].to, "x", "the hint wins");
    let p_fresh = run(&mut s, &cfg, t(1), &mut PlannerState::default());
    assert_eq!(&*p_fresh.candidates[0].moves[0].to, "y");
    // Two loops where src is not simulated (made busy): the hint ages out.
    let mut busy = snapshot(
        nodes(),
        [
            web("wx", "x", "6"),
            web("wy", "y", "7"),
            web("m", "src", "9"),
        ],
    );
    run(&mut busy, &cfg, t(2), &mut state);
    assert_eq!(
        state.hints.get("src", "uid-default-m"),
        Some("x"),
        "one generation kept"
    );
    run(&mut busy, &cfg, t(3), &mut state);
    assert_eq!(state.hints.get("src", "uid-default-m"), None);
}

#[test]
fn leaving_the_set_resets_the_timer() {
    let idle = || build_snapshot(&big_and_n("1")).unwrap();
    let busy = || build_snapshot(&big_and_n("8")).unwrap();
    let cfg = PlannerConfig::default();
    let mut state = PlannerState::default();
    assert_eq!(
        run(&mut idle(), &cfg, t(0), &mut state).candidates[0].since,
        t(0)
    );
    assert_eq!(
        run(&mut idle(), &cfg, t(1), &mut state).candidates[0].since,
        t(0),
        "staying keeps the time"
    );
    assert!(
        run(&mut busy(), &cfg, t(2), &mut state)
            .candidates
            .is_empty()
    );
    assert!(!state.candidates.contains_key("n"));
    assert_eq!(
        run(&mut idle(), &cfg, t(3), &mut state).candidates[0].since,
        t(3),
        "re-entering starts over"
    );
}

#[test]
fn a_deleted_nodes_pods_that_no_longer_fit_block_new_candidates() {
    // "gone" is being deleted; its 5-cpu pod fits on big only if nobody else uses it.
    let mk = |extra: &str| {
        snapshot(
            [
                node("big").cpu("10"),
                node("gone").cpu("10"),
                node("n").cpu("5"),
            ],
            [
                web("w0", "big", extra),
                web("g", "gone", "5"),
                web("w1", "n", "1"),
            ],
        )
    };
    // At 0.7, so that big at 9 of 10 is not underutilized.
    let cfg = PlannerConfig {
        utilization_threshold: 0.7,
        ..PlannerConfig::default()
    };
    let mut state = PlannerState::default();
    let gone: std::collections::BTreeSet<String> = ["gone".to_string()].into();
    let draining = |s: &mut ClusterSnapshot, now, state: &mut PlannerState| {
        plan(
            s,
            &mut PredicateChecker::new(),
            &cfg,
            now,
            state,
            &gone,
            &mut StepStopwatch::default(),
        )
    };
    let p = draining(&mut mk("4"), t(0), &mut state);
    assert!(!p.pending_reschedule);
    assert_eq!(
        names(&p),
        ["n"],
        "the deleted node's pod fits on big, n's pod too (4+5+1)"
    );
    assert_eq!(
        reason_of(&p, "gone").unwrap().reason,
        UnremovableReason::CurrentlyBeingDeleted
    );
    // big holds the deleted node's pod now: 9 of 10.
    assert_eq!(
        reason_of(&p, "big").unwrap().reason,
        UnremovableReason::NotUnderutilized
    );
    let p = draining(&mut mk("6"), t(1), &mut state);
    assert!(p.pending_reschedule);
    assert!(p.candidates.is_empty());
    assert_eq!(
        reason_of(&p, "n").unwrap().reason,
        UnremovableReason::PendingReschedule
    );
    assert!(state.candidates.is_empty());
}

#[test]
fn recent_evictions_are_reinjected_until_the_owner_is_whole() {
    let cfg = PlannerConfig::default(); // window 5m
    let mut state = PlannerState::default();
    state.record_eviction(std::sync::Arc::new(web("w9", "old", "4").build()), t(0));
    // The ReplicaSet wants 3, 2 exist: the evicted pod (4 cpu) fills big, n's pod has no room.
    let mut objs = big_and_n("1");
    objs.replica_sets[0].spec.as_mut().unwrap().replicas = Some(3);
    let mut s = build_snapshot(&objs).unwrap();
    let p = run(&mut s, &cfg, t(1), &mut state);
    assert!(p.candidates.is_empty(), "{:?}", p.candidates);
    assert_eq!(
        reason_of(&p, "n").unwrap().reason,
        UnremovableReason::NoPlaceToMovePods
    );
    assert_eq!(state.recent_evictions.len(), 1);
    // The replacement exists (3 of 3): nothing is injected, n is removable.
    let mut objs = big_and_n("1");
    objs.pods.push(web("w2", "big", "1").build());
    objs.replica_sets[0].spec.as_mut().unwrap().replicas = Some(3);
    let p = run(&mut build_snapshot(&objs).unwrap(), &cfg, t(2), &mut state);
    assert_eq!(names(&p), ["n"]);
    // Once the window has passed, the eviction is forgotten even if the owner is short.
    let p = run(&mut s, &cfg, t(6), &mut state);
    assert_eq!(names(&p), ["n"]);
    assert!(state.recent_evictions.is_empty());
}

#[test]
fn an_evicted_pod_that_fits_nowhere_holds_new_candidates() {
    let mut state = PlannerState::default();
    state.record_eviction(std::sync::Arc::new(pod("bare").cpu("50").build()), t(0));
    let mut s = build_snapshot(&big_and_n("1")).unwrap();
    let p = run(&mut s, &PlannerConfig::default(), t(1), &mut state);
    assert!(p.pending_reschedule);
    assert_eq!(
        reason_of(&p, "n").unwrap().reason,
        UnremovableReason::PendingReschedule
    );
}

#[test]
fn the_time_bound_stops_the_loop_after_the_minimum() {
    let nodes: Vec<_> = (0..10).map(|i| node(&format!("n{i}")).cpu("10")).collect();
    let mut s = snapshot(nodes, Vec::<PodBuilder>::new());
    let mut cfg = PlannerConfig {
        simulation_timeout: Duration::from_secs(3),
        min_nodes_evaluated: 5,
        ..PlannerConfig::default()
    };
    // Already late: exactly the minimum is evaluated.
    let mut late = StepStopwatch {
        step: Duration::ZERO,
        now: Duration::from_secs(60),
    };
    let p = run_timed(&mut s, &cfg, t(0), &mut PlannerState::default(), &mut late);
    assert!(p.simulation.timed_out);
    assert_eq!(p.simulation.nodes_evaluated, 5);
    assert_eq!(p.candidates.len(), 5);
    assert_eq!(
        p.unremovable
            .iter()
            .filter(|u| u.reason == UnremovableReason::NotEvaluated)
            .count(),
        5
    );
    // One second per node past the minimum of 1: read at 1s, 2s, then 3s stops the loop.
    cfg.min_nodes_evaluated = 1;
    let mut watch = StepStopwatch {
        step: Duration::from_secs(1),
        now: Duration::ZERO,
    };
    let p = run_timed(&mut s, &cfg, t(0), &mut PlannerState::default(), &mut watch);
    assert_eq!(p.simulation.nodes_evaluated, 3);
    assert!(p.simulation.timed_out);
    // In time: everything.
    let p = run(&mut s, &cfg, t(0), &mut PlannerState::default());
    assert_eq!(
        (p.simulation.nodes_evaluated, p.simulation.timed_out),
        (10, false)
    );
}

#[test]
fn group_minimum_and_destinations_are_respected() {
    let mut cfg = PlannerConfig {
        node_group_label: Some("pool".into()),
        ..PlannerConfig::default()
    };
    cfg.limits.min_nodes_per_group = 2;
    let nodes: Vec<_> = (0..4)
        .map(|i| node(&format!("n{i}")).cpu("10").label("pool", "a"))
        .collect();
    let mut s = snapshot(nodes, Vec::<PodBuilder>::new());
    let p = run(&mut s, &cfg, t(0), &mut PlannerState::default());
    assert_eq!(p.candidates.len(), 2);
    assert_eq!(
        p.unremovable
            .iter()
            .filter(|u| u.reason == UnremovableReason::NodeGroupMinSizeReached)
            .count(),
        2
    );
}

#[test]
fn a_node_receiving_pods_is_not_a_candidate() {
    // All under threshold: n1 (least used) moves to n3 (fullest); n3 stays a destination.
    let mut s = snapshot(
        [
            node("n1").cpu("10"),
            node("n2").cpu("10"),
            node("n3").cpu("10"),
        ],
        [
            web("a", "n1", "1"),
            web("b", "n2", "2"),
            web("c", "n3", "3"),
        ],
    );
    let p = run(
        &mut s,
        &PlannerConfig::default(),
        t(0),
        &mut PlannerState::default(),
    );
    assert_eq!(names(&p), ["n1", "n2"]);
    assert_eq!(
        reason_of(&p, "n3").unwrap().reason,
        UnremovableReason::DestinationOfMovedPods
    );
}

/// A node that received a replacement of a pod ebb evicted stays while the eviction is recent,
/// so that a later loop does not move that pod again; a node that was a candidate before the
/// replacement landed on it stays one.
#[test]
fn a_node_that_received_replacements_stays_while_the_evictions_are_recent() {
    let cfg = PlannerConfig::default(); // window 5m
    let evicted_at = t(0);
    let landed = evicted_at + jiff::SignedDuration::from_secs(30);
    // n's pod bound at `at`; the ReplicaSet is whole, so nothing is re-injected.
    let w1_bound_at = |at: Timestamp| {
        let mut objs = big_and_n("1");
        objs.pods
            .retain(|p| p.metadata.name.as_deref() != Some("w1"));
        objs.pods.push(web("w1", "n", "1").scheduled_at(at).build());
        build_snapshot(&objs).unwrap()
    };
    let evicted = || {
        let mut state = PlannerState::default();
        state.record_eviction(
            std::sync::Arc::new(web("w9", "old", "1").build()),
            evicted_at,
        );
        state
    };

    // Landed after the eviction: n stays, saying why.
    let p = run(&mut w1_bound_at(landed), &cfg, t(1), &mut evicted());
    assert!(!names(&p).contains(&"n"), "{:?}", p.candidates);
    let u = reason_of(&p, "n").unwrap();
    assert_eq!(u.reason, UnremovableReason::DestinationOfMovedPods);
    assert!(
        u.detail
            .as_deref()
            .is_some_and(|d| d.contains("default/w1")),
        "{u:?}"
    );

    // Bound before the eviction: not a replacement.
    let before = evicted_at - jiff::SignedDuration::from_secs(60);
    let p = run(&mut w1_bound_at(before), &cfg, t(1), &mut evicted());
    assert_eq!(names(&p), ["n"]);

    // n was a candidate before the replacement landed on it: it stays one.
    let mut state = evicted();
    state.candidates.insert("n".into(), evicted_at);
    let p = run(&mut w1_bound_at(landed), &cfg, t(1), &mut state);
    assert_eq!(names(&p), ["n"]);

    // The eviction has left the window: n is a candidate again.
    let p = run(&mut w1_bound_at(landed), &cfg, t(6), &mut evicted());
    assert_eq!(names(&p), ["n"]);
}

#[test]
fn same_input_same_plan() {
    let mk = || {
        let nodes: Vec<_> = (0..30)
            .map(|i| node(&format!("n{i:02}")).cpu("8"))
            .collect();
        let pods: Vec<_> = (0..60)
            .map(|i| {
                web(
                    &format!("w{i}"),
                    &format!("n{:02}", i % 30),
                    if i % 3 == 0 { "2" } else { "500m" },
                )
            })
            .collect();
        snapshot(nodes, pods)
    };
    let a = run(
        &mut mk(),
        &PlannerConfig::default(),
        t(0),
        &mut PlannerState::default(),
    );
    let b = run(
        &mut mk(),
        &PlannerConfig::default(),
        t(0),
        &mut PlannerState::default(),
    );
    assert_eq!(a, b);
    assert!(!a.candidates.is_empty());
}

#[test]
fn at_equal_utilisation_nodes_with_less_warm_data_go_first() {
    // big has 4 cpu free; a (needing `a_cpu`) and b (3) cannot both go.
    let build = |a_cpu: &str, states: Vec<ebb_api::nodestate::NodeState>| {
        let mut o = objects(
            [
                node("big").cpu("10"),
                node("a").cpu("8"),
                node("b").cpu("8"),
            ],
            [
                web("w0", "big", "6"),
                web("w1", "a", a_cpu),
                web("w2", "b", "3"),
            ],
        );
        o.node_states = states;
        build_snapshot(&o).unwrap()
    };
    let cfg = PlannerConfig::default();
    let plan_with = |a_cpu: &str, states| {
        run(
            &mut build(a_cpu, states),
            &cfg,
            t(0),
            &mut PlannerState::default(),
        )
    };
    let cold = plan_with("3", vec![]);
    assert_eq!(names(&cold), ["a"], "by name when no node holds warm data");

    // a holds two roles warm (and b one fetch in progress, which is not warm): b goes instead.
    let two_warm = || node_state_warm("a", &[("db", "primary"), ("db", "replica")]);
    let warm = plan_with("3", vec![two_warm(), node_state_warm("b", &[])]);
    assert_eq!(names(&warm), ["b"]);
    assert_eq!(
        reason_of(&warm, "a").unwrap().reason,
        UnremovableReason::NoPlaceToMovePods
    );

    // Fewer warm roles beat more: a with one, b with two.
    let states = vec![
        node_state_warm("a", &[("db", "primary")]),
        node_state_warm("b", &[("db", "primary"), ("cache", "shard")]),
    ];
    assert_eq!(names(&plan_with("3", states)), ["a"]);

    // Utilisation still comes first: warm data is only a tie-breaker.
    assert_eq!(names(&plan_with("2", vec![two_warm()])), ["a"]);
}

#[test]
fn warm_roles_count_distinct_localized_roles() {
    use crate::cluster::build::warm_roles_by_node;
    let mut a = node_state_warm("a", &[("db", "primary"), ("db", "replica")]);
    // A second resource of a role already counted does not count twice.
    if let Some(st) = a.status.as_mut() {
        let mut again = st.localized[0].clone();
        again.name = "index".into();
        st.localized.push(again);
    }
    let counts = warm_roles_by_node(&[a, node_state_warm("b", &[]), {
        let mut none = node_state_warm("c", &[("x", "y")]);
        none.status = None;
        none
    }]);
    assert_eq!(counts.get("a"), Some(&2));
    assert_eq!(counts.get("b"), None);
    assert_eq!(counts.get("c"), None);
}

#[test]
fn pods_go_to_nodes_the_policy_keeps_before_nodes_it_may_remove_next() {
    // `a` and `b` (governed, a quarter used) and `k` (empty, not governed). Fullest-first alone
    // would move a's pod onto `b`, holding `b` back for another round; `k` stays anyway.
    let cfg = config_selecting("pool", "p");
    let mut s = snapshot(
        [
            node("a").cpu("4").label("pool", "p"),
            node("b").cpu("4").label("pool", "p"),
            node("k").cpu("16"),
        ],
        [web("w1", "a", "1"), web("w2", "b", "1")],
    );
    let p = run(&mut s, &cfg, t(0), &mut PlannerState::default());
    assert_eq!(names(&p), ["a", "b"], "{p:?}");
    assert!(
        p.candidates
            .iter()
            .flat_map(|c| &c.moves)
            .all(|m| &*m.to == "k"),
        "{p:?}"
    );
}

/// A tight pool at threshold 1, where the plain greedy leaves the light `n1` (its 4-cpu pod fits
/// nowhere once `n3`'s pod has filled `n0`) and a later loop would drain `n0`, moving `n3`'s
/// replacement a second time. The look-ahead takes `n0` in the same wave and plans `n3`'s pod
/// straight to where `n0`'s drain puts it.
fn tight_pool() -> ClusterSnapshot {
    snapshot(
        [
            node("n0").cpu("10"),
            node("n1").cpu("10"),
            node("n2").cpu("10"),
            node("n3").cpu("10"),
            node("n4").cpu("10"),
        ],
        [
            web("a0", "n0", "3"),
            web("a1", "n0", "2"),
            web("a2", "n0", "1"),
            web("b0", "n1", "4"),
            web("c0", "n2", "5"),
            web("c1", "n2", "3"),
            web("d0", "n3", "3"),
            web("e0", "n4", "5"),
            web("e1", "n4", "3"),
        ],
    )
}

#[test]
fn the_plan_reaches_the_final_count_in_one_wave_and_moves_nothing_twice() {
    let cfg = PlannerConfig {
        utilization_threshold: 1.0,
        ..PlannerConfig::default()
    };
    let mut s = tight_pool();
    let p = run(&mut s, &cfg, t(0), &mut PlannerState::default());
    let mut removed = names(&p);
    removed.sort();
    assert_eq!(removed, ["n0", "n3"], "{:?}", p.unremovable);
    let gone: Vec<&str> = removed.clone();
    // Every move goes to a node that stays, and the kept nodes can hold what they receive.
    let mut load: std::collections::BTreeMap<&str, f64> =
        [("n1", 4.0), ("n2", 8.0), ("n4", 8.0)].into();
    let size = |pod: &str| match pod.rsplit('/').next().unwrap_or("") {
        "a0" | "d0" => 3.0,
        "a1" => 2.0,
        "a2" => 1.0,
        other => panic!("{other} was not on a removed node"),
    };
    let mut moved = std::collections::BTreeSet::new();
    for c in &p.candidates {
        for m in &c.moves {
            assert!(!gone.contains(&&*m.to), "{m:?} lands on a node that goes");
            assert!(moved.insert(m.pod.clone()), "{} is planned twice", m.pod);
            *load.get_mut(&*m.to).unwrap() += size(&m.pod);
        }
    }
    assert_eq!(moved.len(), 4, "a0, a1, a2 and d0 move: {:?}", p.candidates);
    for (n, l) in &load {
        assert!(*l <= 10.0, "{n} would hold {l} cpu");
    }
    // n0's candidacy moves only the pods really on it; d0 goes from n3 straight to its end.
    let n0 = p.candidates.iter().find(|c| c.node == "n0").unwrap();
    assert!(n0.moves.iter().all(|m| &*m.pod != "default/d0"), "{n0:?}");
    assert_eq!(
        reason_of(&p, "n1").map(|u| u.reason),
        Some(UnremovableReason::NoPlaceToMovePods)
    );
}
