//! The scale bench's cluster (`bench/benches/scale.rs`) as a snapshot, planned as its DryRun
//! policy plans it every loop: where the loop's time goes at 5,000 nodes, without a cluster.

use std::time::{Duration, Instant};

use ebb_controller::cluster::{ClusterObjects, build_snapshot};
use ebb_controller::scaledown::{InstantStopwatch, PlannerState, plan, select_deletions};
use ebb_controller::testkit::{config_selecting, node, objects, pdb_min_available, pod};

/// Nodes per owner, as in the scale bench.
const NODES_PER_OWNER: usize = 10;

/// Nodes `scale-<i>` (4 cpu, 16 GiB, 110 pods) with `per_node` pods of one ReplicaSet each (an
/// owner per 10 nodes); the last tenth of the owners are the drain pool (`pool: drain`, light
/// pods, a budget of 90 % available each), a third of the others light (10m) and the rest busy
/// (100m), as `scale.rs` populates its cluster.
pub fn cluster(nodes: usize, per_node: usize) -> ClusterObjects {
    let owners = nodes.div_ceil(NODES_PER_OWNER);
    let first_drain = owners - owners.div_ceil(10);
    let mut ns = Vec::with_capacity(nodes);
    let mut ps = Vec::with_capacity(nodes * per_node);
    for o in 0..owners {
        let drains = o >= first_drain;
        let (namespace, pool) = if drains {
            ("scale-drain", "drain")
        } else {
            ("scale", "scale")
        };
        let app = format!("app-{o}");
        let cpu = if drains || o % 3 == 0 { "10m" } else { "100m" };
        for n in o * NODES_PER_OWNER..((o + 1) * NODES_PER_OWNER).min(nodes) {
            let name = format!("scale-{n}");
            ns.push(
                node(&name)
                    .cpu("4")
                    .mem("16Gi")
                    .pods(110)
                    .label("pool", pool),
            );
            for k in 0..per_node {
                ps.push(
                    pod(&format!("{app}-{n}-{k}"))
                        .ns(namespace)
                        .on(&name)
                        .cpu(cpu)
                        .mem("64Mi")
                        .label("app", &app)
                        .owned_by_rs(&app),
                );
            }
        }
    }
    let mut objs = objects(ns, ps);
    for o in first_drain..owners {
        let app = format!("app-{o}");
        let count = (NODES_PER_OWNER * per_node) as i32;
        let mut pdb = pdb_min_available(&app, "app", &app, count - count / 10);
        pdb.metadata.namespace = Some("scale-drain".into());
        objs.pdbs.push(pdb);
    }
    objs
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// `loops` loops of the scale pool's policy at its defaults on a cluster of `nodes`, the
/// planner's memory carried from loop to loop as the controller carries it.
pub fn run(nodes: usize, loops: usize) -> Vec<String> {
    let objs = cluster(nodes, 30);
    let mut snap = match build_snapshot(&objs) {
        Ok(s) => s,
        Err(e) => panic!("the scale-shaped cluster does not build: {e}"),
    };
    drop(objs);
    let cfg = config_selecting("pool", "scale");
    let mut state = PlannerState::default();
    let (mut plans, mut selects) = (Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..loops {
        let now = jiff::Timestamp::UNIX_EPOCH;
        let t = Instant::now();
        let p = plan(
            &mut snap,
            &mut ebb_controller::cluster::PredicateChecker::new(),
            &cfg,
            now,
            &mut state,
            &Default::default(),
            &mut InstantStopwatch::start(),
        );
        plans.push(t.elapsed());
        let t = Instant::now();
        let sel = select_deletions(&snap, &p, &state, &cfg, now, false);
        selects.push(t.elapsed());
        std::hint::black_box(&sel);
        last = Some((
            p.candidates.len(),
            p.unremovable.len(),
            p.simulation.nodes_evaluated,
        ));
    }
    let (candidates, unremovable, evaluated) = last.unwrap_or_default();
    vec![format!(
        "scale-shaped {nodes} nodes, {} pods: plan median {:.1} ms, max {:.1} ms; select median {:.1} ms; {candidates} candidates, {unremovable} unremovable, {evaluated} evaluated (last of {loops} loops)",
        nodes * 30,
        median(plans.clone()).as_secs_f64() * 1e3,
        plans
            .iter()
            .max()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3,
        median(selects).as_secs_f64() * 1e3,
    )]
}
