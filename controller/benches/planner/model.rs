//! The shared cluster model against today's rebuild-every-loop path: whole policy loops (model
//! fork, plan, deletions to start) for one policy and for four over disjoint pools, first loop
//! and after 1 % of pods were replaced; the watch events of that churn; the per-drain re-check;
//! the model's memory per pod.

use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ebb_controller::cluster::CachedPod;
use ebb_controller::cluster::types::{Operator, Requirement, Selector};
use ebb_controller::cluster::{
    ClusterEvent, ClusterObjects, LiveCluster, PredicateChecker, build_snapshot,
};
use ebb_controller::scaledown::{
    InstantStopwatch, Plan, PlannerConfig, PlannerState, plan, recheck, select_deletions,
};
use k8s_openapi::api::core::v1::{Node, Taint};

use super::{LIVE, PEAK, cluster, config, median, time};

/// Loops measured per figure (the median is printed).
const RUNS: usize = 5;

/// `EBB_BENCH_NO_BASELINE=1` skips the rebuild baseline (for profiling the model's loops).
fn baseline_runs() -> usize {
    usize::from(std::env::var_os("EBB_BENCH_NO_BASELINE").is_none())
}

fn now() -> jiff::Timestamp {
    jiff::Timestamp::UNIX_EPOCH
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One policy over every node, or four over the pools `pool-0` … `pool-3`.
fn policies(n: usize) -> Vec<PlannerConfig> {
    if n == 1 {
        return vec![config()];
    }
    (0..n)
        .map(|k| PlannerConfig {
            node_selector: Selector {
                requirements: vec![Requirement {
                    key: "pool".into(),
                    operator: Operator::In,
                    values: vec![format!("pool-{k}")],
                }],
            },
            ..config()
        })
        .collect()
}

/// What a policy loop computes from the cluster: the plan and the deletions to start now.
fn policy_loop(
    snap: &mut ebb_controller::cluster::ClusterSnapshot,
    cfg: &PlannerConfig,
    state: &mut PlannerState,
) -> Plan {
    let p = plan(
        snap,
        &mut PredicateChecker::new(),
        cfg,
        now(),
        state,
        &Default::default(),
        &mut InstantStopwatch::start(),
    );
    black_box(select_deletions(snap, &p, state, cfg, now(), false));
    p
}

/// Every policy's loop on the shared model.
fn model_loops(
    live: &mut LiveCluster,
    cfgs: &[PlannerConfig],
    states: &mut [PlannerState],
) -> Vec<Plan> {
    cfgs.iter()
        .zip(states.iter_mut())
        .map(|(cfg, state)| {
            let snap = live.snapshot_mut().unwrap_or_else(|e| panic!("{e}"));
            policy_loop(snap, cfg, state)
        })
        .collect()
}

/// Today: every policy's loop builds its own snapshot from the objects.
fn rebuild_loops(
    objects: &ClusterObjects,
    cfgs: &[PlannerConfig],
    states: &mut [PlannerState],
) -> Vec<Plan> {
    cfgs.iter()
        .zip(states.iter_mut())
        .map(|(cfg, state)| {
            let mut snap = build_snapshot(objects).unwrap_or_else(|e| panic!("{e}"));
            policy_loop(&mut snap, cfg, state)
        })
        .collect()
}

/// The decisions of a plan (its timing left out).
fn decisions(plans: &[Plan]) -> Vec<Plan> {
    plans
        .iter()
        .map(|p| Plan {
            simulation: Default::default(),
            ..p.clone()
        })
        .collect()
}

/// Median of `RUNS` timings of `f` on fresh clones of `states`; returns the last run's plans and
/// states.
fn timed_loops(
    states: &[PlannerState],
    mut f: impl FnMut(&mut [PlannerState]) -> Vec<Plan>,
    runs: usize,
) -> (Duration, Vec<Plan>, Vec<PlannerState>) {
    let mut times = Vec::new();
    let mut last = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let mut st = states.to_vec();
        let (plans, d) = time(|| f(&mut st));
        times.push(d);
        last = (plans, st);
    }
    let t = if times.is_empty() {
        Duration::ZERO
    } else {
        median(times)
    };
    (t, last.0, last.1)
}

/// The watch events that turn `before` into `after` (pods replaced: deleted and created).
fn churn_events(before: &ClusterObjects, after: &ClusterObjects) -> Vec<(CachedPod, CachedPod)> {
    before
        .pods
        .iter()
        .zip(&after.pods)
        .filter(|(a, b)| a.metadata.name != b.metadata.name)
        .map(|(a, b)| (a.clone(), b.clone()))
        .collect()
}

/// `node` with ebb's to-be-deleted taint, as the actuator leaves it when the drain starts.
fn tainted(node: &Node) -> Node {
    let mut n = node.clone();
    n.spec
        .get_or_insert_default()
        .taints
        .get_or_insert_default()
        .push(Taint {
            key: ebb_api::names::TAINT_TO_BE_DELETED.into(),
            value: Some("1".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
    n
}

/// The figures for one cluster size, as printed lines.
pub fn run(nodes: usize) -> Vec<String> {
    let mut out = Vec::new();
    let objects = cluster(nodes, 0);
    let churned = cluster(nodes, 1);
    let pods = objects.pods.len();

    // The model, built once from the objects (later kept current by events).
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let (mut live, build) = time(|| LiveCluster::from_objects(&objects));
    let retained = LIVE.load(Ordering::Relaxed) - base;
    let build_peak = PEAK.load(Ordering::Relaxed) - base;

    let mut warm = Vec::new();
    let mut full_lines = Vec::new();
    for n in [1usize, 4] {
        let cfgs = policies(n);
        let fresh = vec![PlannerState::default(); n];
        let (t, model_plans, states) =
            timed_loops(&fresh, |st| model_loops(&mut live, &cfgs, st), RUNS);
        let (base_t, base_plans, _) = timed_loops(
            &fresh,
            |st| rebuild_loops(&objects, &cfgs, st),
            baseline_runs(),
        );
        let same = base_plans.is_empty() || decisions(&model_plans) == decisions(&base_plans);
        full_lines.push(format!(
            "loop {nodes} nodes, {n} policies, full: {:.1} ms (rebuild baseline {:.1} ms)",
            ms(t),
            ms(base_t)
        ));
        if !same {
            full_lines.push(format!(
                "  !! {n} policies, full: the model's decisions differ from the rebuild's"
            ));
        }
        warm.push((cfgs, states, model_plans));
    }
    out.extend(full_lines);

    // 1 % churn: the watch events, applied to the model.
    let events = churn_events(&objects, &churned);
    let (_, apply) = time(|| {
        for (old, new) in &events {
            live.apply(ClusterEvent::pod_deleted(old))
                .unwrap_or_else(|e| panic!("{e}"));
            live.apply(ClusterEvent::PodApplied(new))
                .unwrap_or_else(|e| panic!("{e}"));
        }
    });
    drop(objects);
    let mut recheck_node_name = None;
    let mut recheck_state = PlannerState::default();
    for (cfgs, states, _) in &warm {
        let n = cfgs.len();
        let (t, model_plans, after) =
            timed_loops(states, |st| model_loops(&mut live, cfgs, st), RUNS);
        let (base_t, base_plans, _) = timed_loops(
            states,
            |st| rebuild_loops(&churned, cfgs, st),
            baseline_runs(),
        );
        out.push(format!(
            "loop {nodes} nodes, {n} policies, churn: {:.1} ms (rebuild baseline {:.1} ms)",
            ms(t),
            ms(base_t)
        ));
        if !base_plans.is_empty() && decisions(&model_plans) != decisions(&base_plans) {
            out.push(format!(
                "  !! {n} policies, churn: the model's decisions differ from the rebuild's"
            ));
        }
        if n == 1 {
            recheck_node_name = model_plans[0]
                .candidates
                .iter()
                .find(|c| !c.empty)
                .map(|c| c.node.clone());
            recheck_state = after[0].clone();
        }
    }
    out.push(format!(
        "  apply events {nodes} nodes: {:.1} ms for {} pods replaced ({} events, {:.1} µs each)",
        ms(apply),
        events.len(),
        2 * events.len(),
        apply.as_secs_f64() * 1e6 / (2 * events.len()).max(1) as f64
    ));

    // The re-check before a drain: the node is tainted to-be-deleted and in the deleted set.
    match recheck_node_name {
        Some(name) => {
            let cfg = config();
            let node = churned
                .nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(name.as_str()))
                .map(tainted)
                .unwrap_or_else(|| panic!("node {name}"));
            live.apply(ClusterEvent::NodeApplied(&node))
                .unwrap_or_else(|e| panic!("{e}"));
            let in_flight: std::collections::BTreeSet<String> = [name.clone()].into();
            let mut times = Vec::new();
            let mut result = Ok(());
            for _ in 0..5 {
                let snap = live.snapshot_mut().unwrap_or_else(|e| panic!("{e}"));
                let (r, d) = time(|| {
                    recheck(
                        snap,
                        &cfg,
                        &recheck_state,
                        &in_flight,
                        &name,
                        now(),
                        &mut InstantStopwatch::start(),
                    )
                });
                times.push(d);
                result = r;
            }
            let mut objs = churned.clone();
            for n in objs.nodes.iter_mut() {
                if n.metadata.name.as_deref() == Some(name.as_str()) {
                    *n = node.clone();
                }
            }
            // Today's path before the shared model: a snapshot built for each re-check.
            let (base_result, base_t) = time(|| {
                let mut snap = build_snapshot(&objs).unwrap_or_else(|e| panic!("{e}"));
                recheck(
                    &mut snap,
                    &cfg,
                    &recheck_state,
                    &in_flight,
                    &name,
                    now(),
                    &mut InstantStopwatch::start(),
                )
            });
            out.push(format!(
                "recheck {nodes} nodes: {:.2} ms",
                ms(median(times))
            ));
            out.push(format!(
                "  re-check of {name}: {result:?} (rebuild baseline {:.1} ms, {base_result:?})",
                ms(base_t)
            ));
        }
        None => out.push(format!(
            "recheck {nodes} nodes: no candidate with pods to re-check"
        )),
    }

    // What the model holds at the end (undo log capacity included), by dropping it.
    let before_drop = LIVE.load(Ordering::Relaxed);
    drop(live);
    let kept = before_drop - LIVE.load(Ordering::Relaxed);
    let peak = build_peak.max(kept);
    out.push(format!(
        "model {nodes} nodes: {:.0} B/pod",
        peak as f64 / pods as f64
    ));
    out.push(format!(
        "  model of {pods} pods: built from the objects in {:.0} ms; {:.1} MiB after the build, \
         {:.1} MiB after the loops and churn, peak {:.1} MiB while built",
        ms(build),
        retained as f64 / 1048576.0,
        kept as f64 / 1048576.0,
        build_peak as f64 / 1048576.0,
    ));
    out
}
