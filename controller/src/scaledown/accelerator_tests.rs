//! Accelerator nodes judged by their accelerators: CPU-only pods leave GPU nodes for CPU nodes,
//! GPUs over the threshold keep their node without a simulation (at the default of 1 every
//! accelerator node is simulated), and GPU pods only go where GPUs are.

use std::collections::{BTreeMap, BTreeSet};

use ebb_api::reasons::UnremovableReason;
use jiff::Timestamp;
use proptest::prelude::*;

use super::config::PlannerConfig;
use super::{Plan, PlannerState, StepStopwatch, plan};
use crate::cluster::{ClusterSnapshot, PredicateChecker};
use crate::testkit::{NodeBuilder, PodBuilder, node, pod, snapshot};

const GPU: &str = "nvidia.com/gpu";

fn t0() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

/// The default config with cpu and memory judged at 0.5 (the scenarios below put CPU nodes at
/// 55-60 %, busy at that threshold), so that what is tested is the accelerators' own, and
/// accelerators at Cluster Autoscaler's 0.5 (a node over it is kept without a simulation).
fn half_cpu() -> PlannerConfig {
    let mut cfg = PlannerConfig {
        utilization_threshold: 0.5,
        ..PlannerConfig::default()
    };
    cfg.accelerators.threshold = 0.5;
    cfg
}

fn run(s: &mut ClusterSnapshot, cfg: &PlannerConfig) -> Plan {
    plan(
        s,
        &mut PredicateChecker::new(),
        cfg,
        t0(),
        &mut PlannerState::default(),
        &BTreeSet::new(),
        &mut StepStopwatch::default(),
    )
}

fn gpu_node(name: &str, gpus: u32) -> NodeBuilder {
    node(name)
        .cpu("16")
        .mem("64Gi")
        .resource(GPU, &gpus.to_string())
}

/// A replicated pod on `node` asking for `gpus` whole GPUs (none: a CPU-only pod) and `cpu`.
fn task(name: &str, on: &str, gpus: u32, cpu: &str) -> PodBuilder {
    let p = pod(name).on(on).cpu(cpu).owned_by_rs(name);
    if gpus > 0 {
        p.resource(GPU, &gpus.to_string())
    } else {
        p
    }
}

fn reason(p: &Plan, node: &str) -> Option<UnremovableReason> {
    p.unremovable
        .iter()
        .find(|u| u.node == node)
        .map(|u| u.reason)
}

fn candidates(p: &Plan) -> Vec<&str> {
    p.candidates.iter().map(|c| c.node.as_str()).collect()
}

/// Where the plan moves each pod (`pod name` → node).
fn destinations(p: &Plan) -> BTreeMap<String, String> {
    p.candidates
        .iter()
        .flat_map(|c| &c.moves)
        .map(|m| {
            (
                m.pod.trim_start_matches("default/").to_string(),
                m.to.to_string(),
            )
        })
        .collect()
}

fn without_accelerators() -> PlannerConfig {
    let mut cfg = half_cpu();
    cfg.accelerators.resources.clear();
    cfg
}

/// `gpu-a`: 1 of 8 GPUs in use, 10 of 16 cpu taken mostly by CPU-only pods. `gpu-b`: 6 of 8
/// GPUs in use, cpu idle. Two CPU nodes with 7 cpu free each (above the cpu threshold).
fn squatters() -> ClusterSnapshot {
    snapshot(
        [
            gpu_node("gpu-a", 8),
            gpu_node("gpu-b", 8),
            node("cpu-1").cpu("16").mem("64Gi"),
            node("cpu-2").cpu("16").mem("64Gi"),
        ],
        [
            task("job-1", "gpu-a", 1, "1"),
            task("api-1", "gpu-a", 0, "3"),
            task("api-2", "gpu-a", 0, "3"),
            task("api-3", "gpu-a", 0, "3"),
            task("job-b", "gpu-b", 6, "2"),
            task("web-1", "cpu-1", 0, "9"),
            task("web-2", "cpu-2", 0, "9"),
        ],
    )
}

#[test]
fn a_gpu_node_with_cpu_squatters_is_a_candidate_and_they_move_to_cpu_nodes() {
    let p = run(&mut squatters(), &half_cpu());
    assert_eq!(candidates(&p), ["gpu-a"]);
    let to = destinations(&p);
    assert_eq!(to.len(), 4, "{to:?}");
    for api in ["api-1", "api-2", "api-3"] {
        assert!(
            to[api] == "cpu-1" || to[api] == "cpu-2",
            "{api} goes to a CPU node though gpu-b has 14 cpu free: {to:?}"
        );
    }
    assert_eq!(to["job-1"], "gpu-b", "the GPU pod goes where a GPU is free");
    assert_eq!(
        reason(&p, "gpu-b"),
        Some(UnremovableReason::AcceleratorsInUse)
    );
    assert_eq!(
        reason(&p, "cpu-1"),
        Some(UnremovableReason::NotUnderutilized)
    );

    // Judged by cpu (no accelerator resources named), gpu-a is busy (10 of 16 cpu), and it is
    // gpu-b, whose GPUs are busy but cpu idle, that is planned away onto gpu-a.
    let p = run(&mut squatters(), &without_accelerators());
    assert_eq!(candidates(&p), ["gpu-b"]);
    assert_eq!(
        reason(&p, "gpu-a"),
        Some(UnremovableReason::NotUnderutilized)
    );
}

#[test]
fn the_accelerator_threshold_is_the_policys() {
    // 1 of 8 GPUs: 0.125. Below 0.2, but not below 0.1.
    for (threshold, candidate) in [(0.2, true), (0.1, false)] {
        let mut cfg = half_cpu();
        cfg.accelerators.threshold = threshold;
        let p = run(&mut squatters(), &cfg);
        assert_eq!(
            candidates(&p).contains(&"gpu-a"),
            candidate,
            "threshold {threshold}"
        );
        if !candidate {
            assert_eq!(
                reason(&p, "gpu-a"),
                Some(UnremovableReason::AcceleratorsInUse)
            );
        }
    }
    // Another resource name: nvidia.com/gpu is then no accelerator, and cpu decides.
    let mut cfg = half_cpu();
    cfg.accelerators.resources = vec!["amd.com/gpu".into()];
    let p = run(&mut squatters(), &cfg);
    assert_eq!(
        reason(&p, "gpu-a"),
        Some(UnremovableReason::NotUnderutilized)
    );
}

/// `gpu-full`: every GPU requested, cpu nearly idle; `cpu-1` busy.
fn full_gpus() -> ClusterSnapshot {
    snapshot(
        [gpu_node("gpu-full", 4), node("cpu-1").cpu("16").mem("64Gi")],
        [
            task("train-1", "gpu-full", 2, "500m"),
            task("train-2", "gpu-full", 2, "500m"),
            task("web-1", "cpu-1", 0, "12"),
        ],
    )
}

#[test]
fn busy_gpus_keep_their_node_without_a_simulation() {
    let p = run(&mut full_gpus(), &half_cpu());
    assert!(p.candidates.is_empty());
    assert_eq!(
        reason(&p, "gpu-full"),
        Some(UnremovableReason::AcceleratorsInUse)
    );
    assert_eq!(p.simulation.nodes_evaluated, 0, "nothing was simulated");
    assert_eq!(p.simulation.predicate_checks, 0);

    // Judged by cpu (1 of 16), the same node is simulated, and found unremovable.
    let p = run(&mut full_gpus(), &without_accelerators());
    assert_eq!(p.simulation.nodes_evaluated, 1);
    assert!(p.simulation.predicate_checks > 0);
    assert_eq!(
        reason(&p, "gpu-full"),
        Some(UnremovableReason::NoPlaceToMovePods)
    );
}

/// `g2`: both GPUs in use by two 1-GPU pods; `g4`: 2 of 4 GPUs in use by one 2-GPU pod; cpu idle
/// on both, and no CPU node.
fn full_and_half() -> ClusterSnapshot {
    snapshot(
        [gpu_node("g2", 2), gpu_node("g4", 4)],
        [
            task("inf-a", "g2", 1, "1"),
            task("inf-b", "g2", 1, "1"),
            task("pair", "g4", 2, "1"),
        ],
    )
}

#[test]
fn at_the_default_a_node_whose_gpus_are_all_in_use_goes_when_its_pods_fit_on_idle_gpus() {
    let cfg = PlannerConfig::default();
    assert_eq!(cfg.accelerators.threshold, 1.0, "the default");
    // g4's 2-GPU pod needs two GPUs on one node: g2 has none free. g2's two 1-GPU pods fit on
    // g4's two idle GPUs, so g2 goes though both its GPUs are in use.
    let p = run(&mut full_and_half(), &cfg);
    assert_eq!(candidates(&p), ["g2"]);
    let to = destinations(&p);
    assert_eq!(to["inf-a"], "g4");
    assert_eq!(to["inf-b"], "g4");

    // At Cluster Autoscaler's 0.5, g2 (1.0) is kept without a simulation, and g4 (0.5) cannot
    // go: the same idle GPUs stay idle.
    let mut ca = PlannerConfig::default();
    ca.accelerators.threshold = 0.5;
    let p = run(&mut full_and_half(), &ca);
    assert!(p.candidates.is_empty(), "{:?}", candidates(&p));
    assert_eq!(reason(&p, "g2"), Some(UnremovableReason::AcceleratorsInUse));
    assert_eq!(reason(&p, "g4"), Some(UnremovableReason::NoPlaceToMovePods));
}

/// 8-, 4- and 2-GPU nodes with pods of 1, 2, 4 and 8 GPUs; the accelerator threshold 0.6.
/// `g8-a` has `spare` GPUs left beside its 8 - `spare`.
fn mixed(spare: u32) -> ClusterSnapshot {
    snapshot(
        [
            gpu_node("g8-a", 8),
            gpu_node("g8-b", 8),
            gpu_node("g8-c", 8),
            gpu_node("g4", 4),
            gpu_node("g2", 2),
            node("cpu-1").cpu("32").mem("64Gi"),
        ],
        [
            task("train", "g8-a", 8 - spare, "1"),
            task("inf-2", "g8-b", 2, "1"),
            task("big-8", "g8-c", 8, "1"),
            task("inf-1", "g4", 1, "1"),
            task("pair-a", "g2", 1, "1"),
            task("pair-b", "g2", 1, "1"),
            task("web", "cpu-1", 0, "20"),
        ],
    )
}

#[test]
fn gpu_pods_of_every_size_move_only_where_their_gpus_fit() {
    let mut cfg = half_cpu();
    cfg.accelerators.threshold = 0.6;
    // g8-a holds a 4-GPU pod (0.5: removable too, but it is the only node with room, so it
    // receives the others' pods). g4 (1 of 4) and g8-b (2 of 8) go; g8-c and g2 are full.
    let p = run(&mut mixed(4), &cfg);
    assert_eq!(candidates(&p), ["g4", "g8-b"]);
    let to = destinations(&p);
    assert_eq!(to["inf-1"], "g8-a");
    assert_eq!(to["inf-2"], "g8-a");
    assert_eq!(
        reason(&p, "g8-a"),
        Some(UnremovableReason::DestinationOfMovedPods)
    );
    assert_eq!(
        reason(&p, "g8-c"),
        Some(UnremovableReason::AcceleratorsInUse)
    );
    assert_eq!(reason(&p, "g2"), Some(UnremovableReason::AcceleratorsInUse));
    assert_eq!(
        reason(&p, "cpu-1"),
        Some(UnremovableReason::NotUnderutilized)
    );

    // With a 6-GPU pod on g8-a only 2 GPUs are free there: g4's 1-GPU pod takes one, and
    // g8-b's 2-GPU pod fits nowhere (cpu-1 has cpu to spare but no GPU).
    let p = run(&mut mixed(2), &cfg);
    assert_eq!(candidates(&p), ["g4"]);
    assert_eq!(destinations(&p)["inf-1"], "g8-a");
    let g8b = p.unremovable.iter().find(|u| u.node == "g8-b");
    assert_eq!(
        g8b.map(|u| u.reason),
        Some(UnremovableReason::NoPlaceToMovePods)
    );
    assert_eq!(g8b.and_then(|u| u.pod.as_deref()), Some("default/inf-2"));
}

/// A random pool: GPU nodes of 8, 4 and 2 GPUs and CPU nodes, with whole-GPU pods of 1, 2, 4
/// or 8 GPUs placed where they fit, and CPU-only pods.
fn pool() -> impl Strategy<Value = (Vec<u32>, Vec<(u32, u32)>)> {
    let nodes =
        proptest::collection::vec(prop_oneof![Just(8u32), Just(4), Just(2), Just(0)], 2..10);
    // (GPUs asked, cpu in halves): placed first-fit at build time.
    let pods = proptest::collection::vec(
        (
            prop_oneof![Just(0u32), Just(1), Just(2), Just(4), Just(8)],
            1u32..8,
        ),
        0..30,
    );
    (nodes, pods)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the mix, every planned move of a GPU pod goes to a node with that resource,
    /// and no node ends with more GPUs or cpu requested than it has.
    #[test]
    fn accelerator_pods_are_never_planned_onto_nodes_without_them((sizes, asks) in pool()) {
        let mut gpus_free: Vec<u32> = sizes.clone();
        let mut cpu_free: Vec<u32> = vec![32; sizes.len()]; // halves of 16 cpu
        let names: Vec<String> = (0..sizes.len()).map(|i| format!("n{i}")).collect();
        let mut pods = Vec::new();
        for (i, (g, c)) in asks.iter().enumerate() {
            let Some(n) = (0..sizes.len()).find(|&n| gpus_free[n] >= *g && cpu_free[n] >= *c) else {
                continue;
            };
            gpus_free[n] -= g;
            cpu_free[n] -= c;
            pods.push(task(&format!("p{i}"), &names[n], *g, &format!("{}m", c * 500)));
        }
        let nodes: Vec<NodeBuilder> = sizes
            .iter()
            .zip(&names)
            .map(|(g, n)| if *g > 0 { gpu_node(n, *g) } else { node(n).cpu("16").mem("64Gi") })
            .collect();
        let mut s = snapshot(nodes, pods);
        let p = run(&mut s, &half_cpu());
        // What each node ends with: its pods, less those moved off, plus those moved on.
        let mut gpus_used: BTreeMap<String, i64> = BTreeMap::new();
        let mut cpu_used: BTreeMap<String, i64> = BTreeMap::new();
        let moved: BTreeMap<&str, &str> = p
            .candidates
            .iter()
            .flat_map(|c| &c.moves)
            .map(|m| (&*m.uid, &*m.to))
            .collect();
        for pid in 0..s.pod_count() as u32 {
            let info = s.pod(pid);
            let Some(home) = s.node_of(pid) else { continue };
            let req = &s.class_of(pid).req.requests;
            let at = moved
                .get(&*info.uid)
                .map(|n| n.to_string())
                .unwrap_or_else(|| s.node(home).name.clone());
            let dest = s.node_id(&at).unwrap();
            let alloc = s.node(dest).allocatable.extended(GPU);
            if req.extended(GPU) > 0 {
                prop_assert!(alloc > 0, "GPU pod {} planned onto {at}, which has no GPU", info.name);
            }
            *gpus_used.entry(at.clone()).or_insert(0) += req.extended(GPU);
            *cpu_used.entry(at).or_insert(0) += req.cpu_milli;
        }
        for (n, used) in &gpus_used {
            let id = s.node_id(n).unwrap();
            prop_assert!(*used <= s.node(id).allocatable.extended(GPU), "{n}: {used} GPUs (milli) requested");
            prop_assert!(cpu_used[n] <= s.node(id).allocatable.cpu_milli, "{n}: cpu over");
        }
        // Candidates are not destinations.
        let removed: BTreeSet<&str> = p.candidates.iter().map(|c| c.node.as_str()).collect();
        for to in moved.values() {
            prop_assert!(!removed.contains(to));
        }
    }
}
