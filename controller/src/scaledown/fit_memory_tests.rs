//! The planner remembers where classes of pods fitted nowhere: the same plan as scanning every
//! node for every pod, with far fewer predicate checks on a full cluster.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::fit_memory::FORGETFUL;
use super::{Plan, PlannerConfig, PlannerState, StepStopwatch, plan};
use crate::cluster::{ClusterSnapshot, PredicateChecker};
use crate::testkit::{PodBuilder, node, pod, snapshot};

fn t0() -> jiff::Timestamp {
    jiff::Timestamp::from_second(1_800_000_000).unwrap()
}

/// Plans `s` at threshold `threshold`, with the memory or without it (`forgetful`).
fn run(s: &mut ClusterSnapshot, threshold: f64, forgetful: bool) -> Plan {
    let cfg = PlannerConfig {
        utilization_threshold: threshold,
        ..PlannerConfig::default()
    };
    FORGETFUL.with(|f| f.set(forgetful));
    let p = plan(
        s,
        &mut PredicateChecker::new(),
        &cfg,
        t0(),
        &mut PlannerState::default(),
        &BTreeSet::new(),
        &mut StepStopwatch::default(),
    );
    FORGETFUL.with(|f| f.set(false));
    p
}

/// A pod of the generated clusters: cpu (250m steps), owner, whether it needs `zone: a`, and
/// whether it holds host port 8080.
type GenPod = (u32, u32, bool, bool);

/// Nodes of 2, 4 or 8 cpu (every other one in `zone: a`) and pods placed where they fit.
fn cluster(sizes: &[u32], pods: &[GenPod]) -> ClusterSnapshot {
    let mut used = vec![0u32; sizes.len()];
    let mut ports = vec![false; sizes.len()];
    let mut built: Vec<PodBuilder> = Vec::new();
    for (i, &(quarters, owner, zoned, port)) in pods.iter().enumerate() {
        let milli = quarters * 250;
        let fits = |n: usize| {
            used[n] + milli <= sizes[n] * 1000
                && (!zoned || n.is_multiple_of(2))
                && !(port && ports[n])
        };
        let Some(n) = (0..sizes.len()).find(|&n| fits(n)) else {
            continue;
        };
        used[n] += milli;
        ports[n] |= port;
        let mut p = pod(&format!("p{i}"))
            .on(&format!("n{n}"))
            .cpu(&format!("{milli}m"))
            .owned_by_rs(&format!("rs{owner}"));
        if zoned {
            p = p.node_selector("zone", "a");
        }
        if port {
            p = p.host_port(8080);
        }
        built.push(p);
    }
    let nodes = sizes.iter().enumerate().map(|(i, c)| {
        let n = node(&format!("n{i}")).cpu(&c.to_string());
        if i.is_multiple_of(2) {
            n.label("zone", "a")
        } else {
            n
        }
    });
    snapshot(nodes, built)
}

/// Everything of a plan but how long it took and how many checks it made.
fn decisions(p: &Plan) -> Plan {
    Plan {
        simulation: Default::default(),
        ..p.clone()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_memory_changes_no_decision(
        sizes in proptest::collection::vec(prop_oneof![Just(2u32), Just(4), Just(8)], 2..14),
        pods in proptest::collection::vec((1u32..13, 0u32..4, proptest::bool::weighted(0.2), proptest::bool::weighted(0.1)), 0..70),
        threshold in prop_oneof![Just(0.5), Just(0.7), Just(1.0)],
    ) {
        let mut s = cluster(&sizes, &pods);
        let scanning = run(&mut s, threshold, true);
        let remembering = run(&mut s, threshold, false);
        prop_assert_eq!(decisions(&scanning), decisions(&remembering));
        prop_assert!(
            remembering.simulation.predicate_checks <= scanning.simulation.predicate_checks,
            "{} checks with the memory, {} without",
            remembering.simulation.predicate_checks,
            scanning.simulation.predicate_checks
        );
    }
}

/// Plans a cluster where nothing can go, scanning and remembering: the same decisions (no
/// candidate), and the predicate checks with the memory and without it.
fn checks_on_a_full_cluster(mut s: ClusterSnapshot) -> (u64, u64) {
    let scanning = run(&mut s, 1.0, true);
    let remembering = run(&mut s, 1.0, false);
    assert!(scanning.candidates.is_empty() && remembering.candidates.is_empty());
    assert_eq!(decisions(&scanning), decisions(&remembering));
    (
        remembering.simulation.predicate_checks,
        scanning.simulation.predicate_checks,
    )
}

/// 200 full nodes of one owner's pods: every drain fails at its first pod, which fits nowhere.
/// Without the memory each failure scans every node; with it, only where the failed drain had
/// given room back (nowhere, since its first pod found none).
#[test]
fn a_full_cluster_costs_a_scan_not_a_scan_per_node() {
    let nodes = (0..200).map(|i| node(&format!("n{i}")).cpu("4"));
    let pods = (0..200).flat_map(|i| {
        (0..4).map(move |j| {
            pod(&format!("p{i}-{j}"))
                .on(&format!("n{i}"))
                .cpu("1")
                .owned_by_rs("web")
        })
    });
    let (with, without) = checks_on_a_full_cluster(snapshot(nodes, pods));
    eprintln!("200 full nodes: {with} predicate checks with the memory, {without} scanning");
    assert!(
        without >= 200 * 199,
        "each node's drain scanned the others: {without}"
    );
    assert!(with <= 2 * 200, "one scan, then none: {with} checks");
}

/// The same full cluster with an owner (and labels) per node, as many clusters have: 200
/// classes of one size. A class that fitted nowhere tells where every larger class of its shape
/// may fit, so the first refused drain scans and the others do not.
#[test]
fn many_owners_of_one_size_cost_a_scan_not_a_scan_per_owner() {
    let nodes = (0..200).map(|i| node(&format!("n{i}")).cpu("4"));
    let pods = (0..200).flat_map(|i| {
        (0..4).map(move |j| {
            let app = format!("web-{i}");
            pod(&format!("p{i}-{j}"))
                .on(&format!("n{i}"))
                .cpu(if i % 2 == 0 { "1" } else { "900m" })
                .label("app", &app)
                .owned_by_rs(&app)
        })
    });
    let (with, without) = checks_on_a_full_cluster(snapshot(nodes, pods));
    eprintln!(
        "200 full nodes, 200 owners: {with} predicate checks with the memory, {without} scanning"
    );
    assert!(
        without >= 200 * 199,
        "each node's drain scanned the others: {without}"
    );
    assert!(
        with <= 3 * 200,
        "a scan for the first class of each size that fails, then none: {with} checks"
    );
}
