//! Removals ordered by what they save per hour (and per evicted pod) when prices are known, and
//! today's order exactly when they are not.

use std::collections::{BTreeMap, BTreeSet};

use ebb_api::names::ANNOTATION_HOURLY_COST;
use jiff::Timestamp;
use proptest::prelude::*;

use super::budgets::Selection;
use super::config::PlannerConfig;
use super::pricing::PriceTable;
use super::{Plan, PlannerState, StepStopwatch, plan, select_deletions};
use crate::cluster::{ClusterSnapshot, PredicateChecker};
use crate::testkit::{NodeBuilder, PodBuilder, node, pod, snapshot};

const TYPE: &str = "node.kubernetes.io/instance-type";
const GPU_PRICE: f64 = 32.77;
const SMALL_PRICE: f64 = 0.096;
const KEEP_PRICE: f64 = 0.768;

fn t0() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

/// One loop and what it would start now (unneeded time ignored).
fn run(s: &mut ClusterSnapshot, cfg: &PlannerConfig) -> (Plan, Selection) {
    let mut state = PlannerState::default();
    let p = plan(
        s,
        &mut PredicateChecker::new(),
        cfg,
        t0(),
        &mut state,
        &BTreeSet::new(),
        &mut StepStopwatch::default(),
    );
    let sel = select_deletions(s, &p, &state, cfg, t0(), true);
    (p, sel)
}

fn prices() -> PriceTable {
    PriceTable {
        label: TYPE.into(),
        per_hour: BTreeMap::from([
            ("p4d.24xlarge".into(), GPU_PRICE),
            ("m5.large".into(), SMALL_PRICE),
            ("m5.4xlarge".into(), KEEP_PRICE),
        ]),
    }
}

/// At most one removal at a time; with the price table or not.
fn budget_of_one(priced: bool) -> PlannerConfig {
    let mut cfg = PlannerConfig::default();
    cfg.limits.max_scale_down_parallelism = 1;
    cfg.limits.max_drain_parallelism = 1;
    cfg.prices = priced.then(prices);
    cfg
}

/// An 8-GPU node named to come last by name (`z-gpu`), ten small CPU nodes, all empty unless
/// `gpu_pods` CPU-only pods sit on the GPU node; `keep` (busy) has room for them.
fn pool(gpu_pods: usize) -> ClusterSnapshot {
    let mut nodes: Vec<NodeBuilder> = vec![
        node("z-gpu")
            .cpu("96")
            .mem("1Ti")
            .resource("nvidia.com/gpu", "8")
            .label(TYPE, "p4d.24xlarge"),
        node("keep").cpu("16").mem("64Gi").label(TYPE, "m5.4xlarge"),
    ];
    for i in 0..10 {
        nodes.push(
            node(&format!("small-{i}"))
                .cpu("2")
                .mem("8Gi")
                .label(TYPE, "m5.large"),
        );
    }
    let mut pods: Vec<PodBuilder> = vec![pod("db").on("keep").cpu("10").owned_by_rs("db")];
    for i in 0..gpu_pods {
        pods.push(
            pod(&format!("api-{i}"))
                .on("z-gpu")
                .cpu("1")
                .owned_by_rs("api"),
        );
    }
    snapshot(nodes, pods)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn an_idle_gpu_node_goes_before_ten_small_nodes_when_the_budget_is_one() {
    let (p, sel) = run(&mut pool(0), &budget_of_one(false));
    assert_eq!(p.candidates.len(), 11);
    assert_eq!(
        sel.empty,
        ["small-0"],
        "without prices: least utilised, then by name"
    );
    assert_eq!(p.cost, None, "no prices, no cost figures");

    let (p, sel) = run(&mut pool(0), &budget_of_one(true));
    assert_eq!(sel.empty, ["z-gpu"]);
    assert_eq!(sel.throttled.len(), 10);
    let cost = p.cost.expect("priced");
    assert!(
        close(cost.removed_per_hour, GPU_PRICE + 10.0 * SMALL_PRICE),
        "{cost:?}"
    );
    assert!(close(cost.kept_per_hour, KEEP_PRICE), "{cost:?}");
    assert_eq!(cost.unpriced, 0);
}

#[test]
fn a_gpu_node_to_drain_goes_before_empty_small_nodes_when_it_saves_more_per_pod() {
    // Without prices, empty nodes go first.
    let (_, sel) = run(&mut pool(2), &budget_of_one(false));
    assert_eq!(sel.empty, ["small-0"]);
    assert!(sel.drain.is_empty());
    // 32.77 / 2 pods saves more per evicted pod than 0.096 for none.
    let (p, sel) = run(&mut pool(2), &budget_of_one(true));
    assert_eq!(sel.drain, ["z-gpu"]);
    assert!(sel.empty.is_empty());
    let gpu = p
        .candidates
        .iter()
        .find(|c| c.node == "z-gpu")
        .expect("candidate");
    assert!(
        gpu.moves.iter().all(|m| &*m.to == "keep"),
        "{:?}",
        gpu.moves
    );
    assert_eq!(gpu.hourly_cost, Some(GPU_PRICE));
}

#[test]
fn the_annotation_prices_a_node_and_unpriced_nodes_are_counted() {
    // No table: only the annotated node is priced; the other is not.
    let mut s = snapshot(
        [
            node("a").cpu("4").annotation(ANNOTATION_HOURLY_COST, "2.5"),
            node("b").cpu("4"),
        ],
        Vec::<PodBuilder>::new(),
    );
    let (p, sel) = run(&mut s, &budget_of_one(false));
    let cost = p.cost.expect("one node priced");
    assert!(close(cost.removed_per_hour, 2.5));
    assert_eq!(cost.unpriced, 1);
    assert_eq!(sel.empty, ["a"]);
    // A priced node goes before an unpriced one, though the unpriced one comes first by name.
    let mut s = snapshot(
        [
            node("a").cpu("4"),
            node("b")
                .cpu("4")
                .annotation(ANNOTATION_HOURLY_COST, "0.01"),
        ],
        Vec::<PodBuilder>::new(),
    );
    let (_, sel) = run(&mut s, &budget_of_one(false));
    assert_eq!(sel.empty, ["b"], "a priced node before an unpriced one");
    // An unreadable annotation is ignored, and named; the order stays today's.
    let mut s = snapshot(
        [
            node("a").cpu("4"),
            node("b").cpu("4").annotation(ANNOTATION_HOURLY_COST, "$3"),
        ],
        Vec::<PodBuilder>::new(),
    );
    let (p, sel) = run(&mut s, &budget_of_one(false));
    assert_eq!(sel.empty, ["a"]);
    let cost = p.cost.expect("reported");
    assert_eq!(cost.invalid_annotations, ["b"]);
    assert_eq!(cost.unpriced, 2);
    assert!(close(cost.removed_per_hour, 0.0));
}

/// A random CPU pool: node sizes (cpu) and pods (cpu in halves, first fit).
fn cpu_pool() -> impl Strategy<Value = (Vec<u32>, Vec<u32>)> {
    (
        proptest::collection::vec(prop_oneof![Just(4u32), Just(8), Just(16)], 1..12),
        proptest::collection::vec(1u32..8, 0..30),
    )
}

/// Nodes `n<i>` of `sizes` cpu with `halves` pods placed first-fit; each node's requested cpu
/// (milli) as placed.
fn build(sizes: &[u32], halves: &[u32]) -> (ClusterSnapshot, Vec<i64>) {
    let mut used = vec![0i64; sizes.len()];
    let mut pods = Vec::new();
    for (i, h) in halves.iter().enumerate() {
        let milli = i64::from(*h) * 500;
        let Some(n) = (0..sizes.len()).find(|&n| used[n] + milli <= i64::from(sizes[n]) * 1000)
        else {
            continue;
        };
        used[n] += milli;
        pods.push(
            pod(&format!("p{i}"))
                .on(&format!("n{i}", i = n))
                .cpu(&format!("{milli}m"))
                .owned_by_rs("web"),
        );
    }
    let nodes: Vec<NodeBuilder> = sizes
        .iter()
        .enumerate()
        .map(|(i, c)| {
            node(&format!("n{i}"))
                .cpu(&c.to_string())
                .label(TYPE, "m5.large")
        })
        .collect();
    (snapshot(nodes, pods), used)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Without a known price the plan and the selection are those of a policy without prices,
    /// and candidates come least utilised first (then by name), as they always have.
    #[test]
    fn without_prices_the_order_is_todays((sizes, halves) in cpu_pool()) {
        let (mut s, used) = build(&sizes, &halves);
        let plain = PlannerConfig::default();
        let (p0, sel0) = run(&mut s, &plain);
        // A table naming no node's value, and no accelerator named: nothing changes.
        let mut unmatched = PlannerConfig {
            prices: Some(PriceTable {
                label: TYPE.into(),
                per_hour: BTreeMap::from([("p4d.24xlarge".into(), GPU_PRICE)]),
            }),
            ..PlannerConfig::default()
        };
        unmatched.accelerators.resources.clear();
        let (p1, sel1) = run(&mut s, &unmatched);
        prop_assert_eq!(&p0, &p1);
        prop_assert_eq!(&sel0, &sel1);
        prop_assert_eq!(p0.cost, None);
        // Today's order, from the figures this test placed.
        let util = |name: &str| {
            let i: usize = name[1..].parse().unwrap();
            (used[i] as f64 / (f64::from(sizes[i]) * 1000.0), name.to_string())
        };
        let order: Vec<(f64, String)> = p0.candidates.iter().map(|c| util(&c.node)).collect();
        for w in order.windows(2) {
            prop_assert!(w[0].0 < w[1].0 || (w[0].0 == w[1].0 && w[0].1 < w[1].1), "{order:?}");
        }
        // Empty candidates start first, in that order.
        let empty_first: Vec<&String> = p0.candidates.iter().filter(|c| c.empty).map(|c| &c.node).collect();
        let started: Vec<&String> = sel0.empty.iter().collect();
        prop_assert_eq!(&started[..], &empty_first[..started.len()]);
    }

    /// Empty nodes with random prices and room for `k` removals: the `k` most expensive go.
    #[test]
    fn with_prices_the_most_expensive_removals_go_first(
        cents in proptest::collection::vec(0u32..5000, 1..15),
        k in 1i64..5,
    ) {
        let nodes: Vec<NodeBuilder> = cents
            .iter()
            .enumerate()
            .map(|(i, c)| {
                node(&format!("n{i}"))
                    .cpu("4")
                    .annotation(ANNOTATION_HOURLY_COST, &format!("{}.{:02}", c / 100, c % 100))
            })
            .collect();
        let mut s = snapshot(nodes, Vec::<PodBuilder>::new());
        let mut cfg = PlannerConfig::default();
        cfg.limits.max_scale_down_parallelism = k;
        let (p, sel) = run(&mut s, &cfg);
        let mut chosen: Vec<u32> = sel
            .empty
            .iter()
            .map(|n| cents[n[1..].parse::<usize>().unwrap()])
            .collect();
        chosen.sort_unstable_by(|a, b| b.cmp(a));
        let mut top = cents.clone();
        top.sort_unstable_by(|a, b| b.cmp(a));
        top.truncate(k as usize);
        prop_assert_eq!(chosen, top);
        let total: f64 = cents.iter().map(|c| f64::from(*c) / 100.0).sum();
        let cost = p.cost.unwrap();
        prop_assert!((cost.removed_per_hour - total).abs() < 1e-6);
    }
}

#[test]
fn a_policy_read_from_a_file_with_a_negative_price_is_refused_naming_the_field() {
    let spec: ebb_api::ScaleDownPolicySpec =
        serde_json::from_value(serde_json::json!({"prices": {"perHour": {"m5.large": -1.0}}}))
            .unwrap();
    let e = PlannerConfig::from_spec(&spec).err().map(|e| e.to_string());
    assert!(
        e.as_deref()
            .is_some_and(|e| e.starts_with("spec.prices.perHour: `m5.large`")),
        "{e:?}"
    );
    let spec: ebb_api::ScaleDownPolicySpec =
        serde_json::from_value(serde_json::json!({"acceleratorUtilizationThreshold": 1.5}))
            .unwrap();
    let e = PlannerConfig::from_spec(&spec).err().map(|e| e.to_string());
    assert!(
        e.as_deref()
            .is_some_and(|e| e.starts_with("spec.acceleratorUtilizationThreshold")),
        "{e:?}"
    );
}

/// A GPU node of `gpus` GPUs priced at `per_hour` (by annotation; `None`: unpriced), with `used`
/// pods of one GPU.
fn priced_gpu(
    name: &str,
    gpus: u32,
    per_hour: Option<f64>,
    used: u32,
) -> (NodeBuilder, Vec<PodBuilder>) {
    let mut n = node(name)
        .cpu("64")
        .mem("256Gi")
        .resource("nvidia.com/gpu", &gpus.to_string());
    if let Some(c) = per_hour {
        n = n.annotation(ANNOTATION_HOURLY_COST, &c.to_string());
    }
    let pods = (0..used)
        .map(|i| {
            pod(&format!("{name}-infer-{i}"))
                .on(name)
                .cpu("1")
                .resource("nvidia.com/gpu", "1")
                .owned_by_rs("infer")
        })
        .collect();
    (n, pods)
}

/// The default config with accelerators judged at Cluster Autoscaler's 0.5 (the default is 1,
/// which simulates every accelerator node): what the dear-node rule adds to a threshold.
fn gpu_threshold_half() -> PlannerConfig {
    let mut cfg = PlannerConfig::default();
    cfg.accelerators.threshold = 0.5;
    cfg
}

fn gpu_snapshot(nodes: Vec<(NodeBuilder, Vec<PodBuilder>)>) -> ClusterSnapshot {
    let (nodes, pods): (Vec<_>, Vec<_>) = nodes.into_iter().unzip();
    snapshot(nodes, pods.into_iter().flatten())
}

/// `big`: 8 GPUs at 24/h (3 per GPU), 5 in use, above the accelerator threshold 0.5. `mid`: 4
/// GPUs at 10/h (2.5 per GPU), 1 in use. Five `small` nodes: 2 GPUs at 4/h (2 per GPU), 1 in
/// use each. Five GPUs are free on the small nodes, three on `mid`.
/// Unpriced when not `priced`.
fn dear_and_cheap(priced: bool) -> ClusterSnapshot {
    let price = |c: f64| priced.then_some(c);
    let mut nodes = vec![
        priced_gpu("big", 8, price(24.0), 5),
        priced_gpu("mid", 4, price(10.0), 1),
    ];
    for i in 0..5 {
        nodes.push(priced_gpu(&format!("small-{i}"), 2, price(4.0), 1));
    }
    gpu_snapshot(nodes)
}

#[test]
fn a_dear_gpu_node_above_the_threshold_moves_onto_cheaper_gpus() {
    // Without prices, `big` is busy (5/8 > 0.5) and kept.
    let (p, _) = run(&mut dear_and_cheap(false), &gpu_threshold_half());
    assert!(
        p.candidates.iter().all(|c| c.node != "big"),
        "{:?}",
        p.candidates
    );

    // Priced: `big` costs more per GPU than the small nodes, so it is simulated though busy,
    // and first (it saves the most per hour): its pods take the room the small nodes and `mid`
    // have, and `mid`'s one pod then has none. Saving `mid` first (10 per evicted pod against
    // 4.8) would leave 24 + 20 = 44 per hour; this keeps 10 + 20 = 30.
    let (p, _) = run(&mut dear_and_cheap(true), &gpu_threshold_half());
    let names: Vec<&str> = p.candidates.iter().map(|c| c.node.as_str()).collect();
    assert_eq!(names, ["big"]);
    let big = &p.candidates[0];
    assert_eq!(big.moves.len(), 5);
    assert!(big.moves.iter().all(|m| &*m.to != "big"));
    let cost = p.cost.expect("priced");
    assert!(close(cost.removed_per_hour, 24.0), "{cost:?}");
    assert!(close(cost.kept_per_hour, 30.0), "{cost:?}");
}

/// A dear node whose GPUs are all in use is simulated too: its eight 1-GPU pods fit on eight
/// cheaper 2-GPU nodes with one GPU free each. Unpriced, it is kept as `AcceleratorsInUse`.
#[test]
fn a_full_dear_gpu_node_goes_when_its_pods_fit_on_cheaper_gpus() {
    let pool = |priced: bool| {
        let mut nodes = vec![priced_gpu("full", 8, priced.then_some(24.0), 8)];
        for i in 0..8 {
            nodes.push(priced_gpu(
                &format!("small-{i}"),
                2,
                priced.then_some(4.0),
                1,
            ));
        }
        gpu_snapshot(nodes)
    };
    let (p, _) = run(&mut pool(true), &gpu_threshold_half());
    let names: Vec<&str> = p.candidates.iter().map(|c| c.node.as_str()).collect();
    assert_eq!(names, ["full"]);
    assert_eq!(p.candidates[0].moves.len(), 8);
    let (p, _) = run(&mut pool(false), &gpu_threshold_half());
    assert!(
        p.candidates.iter().all(|c| c.node != "full"),
        "{:?}",
        p.candidates
    );
    assert_eq!(
        p.unremovable
            .iter()
            .find(|u| u.node == "full")
            .map(|u| u.reason),
        Some(ebb_api::reasons::UnremovableReason::AcceleratorsInUse)
    );
}

/// `a`: 8 GPUs at 24/h, 4 in use. `b`: 4 GPUs at 10/h (2.5 per GPU, dear), 3 in use. Seven
/// small nodes: 2 GPUs at 4/h (2 per GPU), 1 in use each: 7 GPUs free, room for the pods of both.
#[test]
fn moved_gpu_pods_go_to_the_cheapest_gpus_first() {
    let mut nodes = vec![
        priced_gpu("a", 8, Some(24.0), 4),
        priced_gpu("b", 4, Some(10.0), 3),
    ];
    for i in 0..7 {
        nodes.push(priced_gpu(&format!("small-{i}"), 2, Some(4.0), 1));
    }
    let (p, _) = run(&mut gpu_snapshot(nodes), &gpu_threshold_half());
    let mut names: Vec<&str> = p.candidates.iter().map(|c| c.node.as_str()).collect();
    names.sort_unstable();
    // Fullest first would put one of `a`'s pods on `b` (3 of 4 in use), and keep `b` for it:
    // 10 + 28 per hour. Cheapest first fills the small nodes, and both dear nodes go.
    assert_eq!(names, ["a", "b"]);
    for c in &p.candidates {
        assert!(
            c.moves.iter().all(|m| m.to.starts_with("small-")),
            "{:?}",
            c.moves
        );
    }
    let cost = p.cost.expect("priced");
    assert!(close(cost.kept_per_hour, 28.0), "{cost:?}");
}

#[test]
fn in_a_pool_of_one_price_per_gpu_the_accelerator_threshold_holds() {
    // Both nodes cost 3 per GPU: moving `a`'s 5 pods onto `b` would save a node, but not by
    // moving to cheaper GPUs, so the threshold (0.5) decides as without prices.
    let mut s = gpu_snapshot(vec![
        priced_gpu("a", 8, Some(24.0), 5),
        priced_gpu("b", 8, Some(24.0), 2),
        priced_gpu("c", 4, Some(12.0), 3),
    ]);
    let (p, _) = run(&mut s, &gpu_threshold_half());
    let names: Vec<&str> = p.candidates.iter().map(|c| c.node.as_str()).collect();
    assert_eq!(names, ["b"]);
    for busy in ["a", "c"] {
        assert_eq!(
            p.unremovable
                .iter()
                .find(|u| u.node == busy)
                .map(|u| u.reason),
            Some(ebb_api::reasons::UnremovableReason::AcceleratorsInUse),
            "{busy}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// GPU pools priced at one price per GPU (any node sizes, any use): prices change the order
    /// of the simulation, never which nodes are simulated: every node the accelerator threshold
    /// keeps without prices is kept with them, for the same reason.
    #[test]
    fn one_price_per_gpu_simulates_what_the_threshold_allows(
        pool in proptest::collection::vec((prop_oneof![Just(2u32), Just(4), Just(8)], 0u32..9), 1..10),
        per_gpu in 1u32..10,
    ) {
        let nodes = |priced: bool| -> Vec<_> {
            pool.iter()
                .enumerate()
                .map(|(i, (gpus, used))| {
                    let price = priced.then(|| f64::from(gpus * per_gpu));
                    priced_gpu(&format!("n{i}"), *gpus, price, (*used).min(*gpus))
                })
                .collect()
        };
        let mut priced = gpu_snapshot(nodes(true));
        let mut plain = gpu_snapshot(nodes(false));
        let (p0, _) = run(&mut plain, &gpu_threshold_half());
        let (p1, _) = run(&mut priced, &gpu_threshold_half());
        let busy = |p: &Plan| -> BTreeSet<String> {
            p.unremovable
                .iter()
                .filter(|u| u.reason == ebb_api::reasons::UnremovableReason::AcceleratorsInUse)
                .map(|u| u.node.clone())
                .collect()
        };
        prop_assert_eq!(busy(&p0), busy(&p1));
        // And a node at or below the threshold is the only kind ever a candidate.
        for c in &p1.candidates {
            let i: usize = c.node[1..].parse().unwrap();
            let (gpus, used) = pool[i];
            prop_assert!(f64::from(used.min(gpus)) / f64::from(gpus) <= 0.5, "{}", c.node);
        }
    }
}

/// The re-check before a drain plans for the drained node alone: it still judges the node
/// against all of the policy's nodes, so a dear node the plan chose is not refused as busy.
#[test]
fn the_recheck_of_a_dear_gpu_node_judges_it_against_the_whole_pool() {
    let recheck_big = |priced: bool| {
        super::recheck::recheck(
            &mut dear_and_cheap(priced),
            &gpu_threshold_half(),
            &PlannerState::default(),
            &BTreeSet::new(),
            "big",
            t0(),
            &mut StepStopwatch::default(),
        )
    };
    assert_eq!(recheck_big(true), Ok(()));
    // Unpriced, the same re-check refuses it: its GPUs are in use.
    assert_eq!(
        recheck_big(false).err().and_then(|r| r.reason()),
        Some(ebb_api::reasons::UnremovableReason::AcceleratorsInUse)
    );
}
