//! The planner's central invariant over random clusters: every candidate node can go at the
//! same time. The planner's moves, applied all at once, are checked by a deliberately simple
//! checker written here (resources, pod count, node selector, taints, hostname anti-affinity),
//! and no PodDisruptionBudget is exceeded by evicting all moved pods.

use std::collections::{BTreeMap, HashMap};

use ebb_controller::cluster::{PredicateChecker, build_snapshot};
use ebb_controller::scaledown::{
    PlannerConfig, PlannerState, StepStopwatch, plan, select_deletions,
};
use ebb_controller::testkit::{node, objects, pdb_min_available, pod, taint};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct TNode {
    cpu_m: i64,
    mem_mi: i64,
    max_pods: i64,
    pool: &'static str,
    tainted: bool,
}

#[derive(Clone, Debug)]
struct TPod {
    node: usize,
    cpu_m: i64,
    mem_mi: i64,
    app: usize,
    pool_selector: Option<&'static str>,
    tolerates: bool,
    daemon: bool,
}

/// App 0 is "solo": its pods repel each other per host.
const SOLO: usize = 0;

fn arb_node() -> impl Strategy<Value = TNode> {
    (
        1i64..=8,
        1i64..=16,
        3i64..=12,
        prop::bool::ANY,
        prop::bool::weighted(0.2),
    )
        .prop_map(|(cpu, mem, max_pods, pool, tainted)| TNode {
            cpu_m: cpu * 1000,
            mem_mi: mem * 1024,
            max_pods,
            pool: if pool { "x" } else { "y" },
            tainted,
        })
}

fn arb_pod(nodes: usize) -> impl Strategy<Value = TPod> {
    (
        0..nodes,
        1i64..=20,
        1i64..=16,
        0usize..4,
        prop::option::weighted(0.3, prop::bool::ANY),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(node, cpu, mem, app, sel, tolerates, daemon)| TPod {
            node,
            cpu_m: cpu * 100,
            mem_mi: mem * 256,
            app,
            pool_selector: sel.map(|x| if x { "x" } else { "y" }),
            tolerates,
            daemon,
        })
}

fn arb_cluster() -> impl Strategy<Value = (Vec<TNode>, Vec<TPod>, Vec<i32>, f64)> {
    (2usize..10).prop_flat_map(|n| {
        (
            prop::collection::vec(arb_node(), n),
            prop::collection::vec(arb_pod(n), 0..30),
            // minAvailable per app (apps 1..3), 0 = no PDB
            prop::collection::vec(0i32..4, 4),
            0.2f64..1.0,
        )
    })
}

fn app_name(app: usize) -> String {
    format!("app{app}")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn candidates_can_all_go_at_once((nodes, pods, min_available, threshold) in arb_cluster()) {
        let node_names: Vec<String> = (0..nodes.len()).map(|i| format!("n{i}")).collect();
        let k8s_nodes: Vec<_> = nodes.iter().zip(&node_names).map(|(n, name)| {
            let b = node(name).cpu(&format!("{}m", n.cpu_m)).mem(&format!("{}Mi", n.mem_mi)).pods(n.max_pods as u32).label("pool", n.pool);
            if n.tainted { b.taint(taint("dedicated", "db", "NoSchedule")) } else { b }
        }).collect();
        let pod_names: Vec<String> = (0..pods.len()).map(|i| format!("p{i}")).collect();
        let k8s_pods: Vec<_> = pods.iter().zip(&pod_names).map(|(p, name)| {
            let mut b = pod(name).on(&node_names[p.node]).cpu(&format!("{}m", p.cpu_m)).mem(&format!("{}Mi", p.mem_mi)).label("app", &app_name(p.app));
            b = if p.daemon { b.owned_by_ds("agent") } else { b.owned_by_rs(&app_name(p.app)) };
            if let Some(pool) = p.pool_selector { b = b.node_selector("pool", pool); }
            if p.tolerates { b = b.tolerate("dedicated", "NoSchedule"); }
            if p.app == SOLO && !p.daemon { b = b.anti_affinity("app", &app_name(SOLO), "kubernetes.io/hostname"); }
            b
        }).collect();
        let mut objs = objects(k8s_nodes, k8s_pods);
        for (app, min) in min_available.iter().enumerate().skip(1) {
            if *min > 0 {
                objs.pdbs.push(pdb_min_available(&app_name(app), "app", &app_name(app), *min));
            }
        }
        let mut snap = build_snapshot(&objs).unwrap();
        let cfg = PlannerConfig { utilization_threshold: threshold, ..PlannerConfig::default() };
        let mut state = PlannerState::default();
        let result = plan(&mut snap, &mut PredicateChecker::new(), &cfg, jiff::Timestamp::UNIX_EPOCH, &mut state, &Default::default(), &mut StepStopwatch::default());

        // Apply every move at once.
        let index: HashMap<&str, usize> = node_names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
        let candidate: Vec<bool> = node_names.iter().map(|n| result.candidates.iter().any(|c| &c.node == n)).collect();
        let mut at: Vec<usize> = pods.iter().map(|p| p.node).collect();
        let mut moved = vec![false; pods.len()];
        for c in &result.candidates {
            for m in &c.moves {
                let i: usize = m.pod.trim_start_matches("default/p").parse().unwrap();
                prop_assert_eq!(&node_names[pods[i].node], &c.node, "a move lists a pod of another node");
                let to = index[&*m.to];
                prop_assert!(!candidate[to], "{} moves onto candidate {}", m.pod, m.to);
                at[i] = to;
                moved[i] = true;
            }
        }
        // Every pod of a candidate leaves, except DaemonSet pods, which go with the node.
        for (i, p) in pods.iter().enumerate() {
            if candidate[p.node] && !p.daemon {
                prop_assert!(moved[i], "pod p{} of candidate {} has no destination", i, node_names[p.node]);
            }
        }
        // The simple checker: final totals fit every node that received pods.
        for (n, tn) in nodes.iter().enumerate() {
            if !(0..pods.len()).any(|i| moved[i] && at[i] == n) { continue; }
            let here: Vec<usize> = (0..pods.len()).filter(|i| at[*i] == n && !(candidate[pods[*i].node] && pods[*i].daemon && pods[*i].node != n)).collect();
            let cpu: i64 = here.iter().map(|i| pods[*i].cpu_m).sum();
            let mem: i64 = here.iter().map(|i| pods[*i].mem_mi).sum();
            prop_assert!(cpu <= tn.cpu_m, "cpu over on n{}: {} > {}", n, cpu, tn.cpu_m);
            prop_assert!(mem <= tn.mem_mi, "memory over on n{}", n);
            prop_assert!(here.len() as i64 <= tn.max_pods, "too many pods on n{}", n);
        }
        for (i, p) in pods.iter().enumerate() {
            if !moved[i] { continue; }
            let dest = &nodes[at[i]];
            if let Some(pool) = p.pool_selector { prop_assert_eq!(dest.pool, pool); }
            prop_assert!(!dest.tainted || p.tolerates, "p{} on a tainted node", i);
            let others_same_app = (0..pods.len()).filter(|j| *j != i && at[*j] == at[i] && pods[*j].app == p.app && !pods[*j].daemon).count();
            if p.app == SOLO {
                prop_assert_eq!(others_same_app, 0, "solo pod p{} shares n{}", i, at[i]);
            }
        }
        // PDBs pace the drains, not the candidacy: the drains that start at once never take
        // more of an app than its budget allows, except one drain alone on that budget (its
        // evictions then follow one another as the budget allows).
        let sel = select_deletions(&snap, &result, &state, &cfg, jiff::Timestamp::UNIX_EPOCH, true);
        let started: Vec<usize> = sel.drain.iter().chain(&sel.empty).map(|n| index[n.as_str()]).collect();
        let mut total_per_app: BTreeMap<usize, i32> = BTreeMap::new();
        for p in &pods {
            *total_per_app.entry(p.app).or_insert(0) += 1;
        }
        for (app, min) in min_available.iter().enumerate().skip(1) {
            if *min == 0 { continue; }
            let total = total_per_app.get(&app).copied().unwrap_or(0);
            let allowed = (total - min).max(0);
            let per_node: Vec<i32> = started.iter().map(|n| {
                pods.iter().filter(|p| p.node == *n && p.app == app && !p.daemon).count() as i32
            }).filter(|c| *c > 0).collect();
            let taken: i32 = per_node.iter().sum();
            prop_assert!(
                taken <= allowed || (per_node.len() == 1 && allowed >= 1),
                "PDB of app{} exceeded: {:?} of {} allowed", app, per_node, allowed
            );
        }
    }
}
