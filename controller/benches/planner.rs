//! Planner benchmark: synthetic clusters of 1,000 and 5,000 nodes × 30 pods (mixed node sizes,
//! ~300 owners, some hostname anti-affinity and PDBs, about a third of the nodes removable).
//! Measures the full plan, the incremental plan after 1 % of pods change (hints warm), peak
//! memory, and a Cluster-Autoscaler-style baseline (each node simulated alone on a fresh
//! snapshot copy, every pod scanning all nodes with uncached predicates, no hints).
//! Then the shared cluster model (`model.rs`) at 5,000 and 20,000 nodes against rebuilding the
//! snapshot every loop. `EBB_BENCH_MODEL_ONLY=1` runs only that part; `EBB_BENCH_MODEL_NODES`
//! (comma-separated) sets its sizes. Last, the scale bench's cluster (`scale_shape.rs`) planned
//! loop after loop as its DryRun policy plans it; `EBB_BENCH_SCALE_SHAPE=5000` runs only that.

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use ebb_controller::cluster::{
    ClusterObjects, ClusterSnapshot, NodeId, PredicateChecker, build_snapshot,
};
use ebb_controller::scaledown::drainability::pods_to_move;
use ebb_controller::scaledown::eligibility::{self, check_node};
use ebb_controller::scaledown::pdb::PdbTracker;
use ebb_controller::scaledown::{InstantStopwatch, Plan, PlannerConfig, PlannerState, plan};
use ebb_controller::testkit::{node, objects, pdb_min_available, pod};
use mimalloc::MiMalloc;

#[path = "planner/model.rs"]
mod model;
#[path = "planner/scale_shape.rs"]
mod scale_shape;

/// Counts live bytes and remembers the peak, allocating with mimalloc as the controller does.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { MiMalloc.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { MiMalloc.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const PODS_PER_NODE: usize = 30;

/// Node sizes (cpu, memory GiB) and the busy-pod size that fills them to ~70 %.
const SIZES: [(u32, u32, u32, u32); 3] =
    [(8, 32, 180, 700), (16, 64, 360, 1400), (32, 128, 720, 2800)];

/// A synthetic cluster: two thirds of the nodes busy (~70 % requested), one third light
/// (~15 %, small pods of 30 "light" owners, 3 of them with hostname anti-affinity).
fn cluster(nodes: usize, churn: u64) -> ClusterObjects {
    let mut ns = Vec::with_capacity(nodes);
    let mut ps = Vec::with_capacity(nodes * PODS_PER_NODE);
    let mut counter = 0usize;
    for i in 0..nodes {
        let size = i % 3;
        let (cpu, mem, busy_cpu_m, busy_mem_mi) = SIZES[size];
        let name = format!("node-{i:05}");
        ns.push(
            node(&name)
                .cpu(&cpu.to_string())
                .mem(&format!("{mem}Gi"))
                .label("topology.kubernetes.io/zone", ["a", "b", "c"][i % 3])
                .label("pool", &format!("pool-{}", i % 4)),
        );
        let light = i % 3 == 1;
        for j in 0..PODS_PER_NODE {
            counter += 1;
            // 1 % of pods get a new name (and UID) per churn step: replaced pods.
            let renamed = churn > 0 && (counter as u64).is_multiple_of(100);
            let pname = if renamed {
                format!("p{counter}-r{churn}")
            } else {
                format!("p{counter}")
            };
            let p = if light {
                let owner = (i / 3 + j) % 30;
                let mut b = pod(&pname)
                    .on(&name)
                    .cpu("50m")
                    .mem("128Mi")
                    .label("app", &format!("light-{owner}"))
                    .owned_by_rs(&format!("light-{owner}"));
                if owner < 3 {
                    b = b.anti_affinity("app", &format!("light-{owner}"), "kubernetes.io/hostname");
                }
                b
            } else {
                let owner = 30 + size * 90 + (i / 3 + j) % 90;
                pod(&pname)
                    .on(&name)
                    .cpu(&format!("{busy_cpu_m}m"))
                    .mem(&format!("{}Mi", busy_mem_mi / 3))
                    .label("app", &format!("busy-{owner}"))
                    .owned_by_rs(&format!("busy-{owner}"))
            };
            ps.push(p);
        }
    }
    let mut objs = objects(ns, ps);
    // PDBs: 20 busy owners (never on candidates), and 3 light owners allowing 90 % to go.
    for owner in (30..50).chain(10..13) {
        let app = if owner < 30 {
            format!("light-{owner}")
        } else {
            format!("busy-{owner}")
        };
        let count = objs
            .pods
            .iter()
            .filter(|p| p.metadata.labels.as_ref().and_then(|l| l.get("app")) == Some(&app))
            .count();
        let min = if owner < 30 {
            count / 10
        } else {
            count.saturating_sub(5)
        };
        objs.pdbs
            .push(pdb_min_available(&app, "app", &app, min as i32));
    }
    objs
}

fn config() -> PlannerConfig {
    PlannerConfig {
        simulation_timeout: Duration::from_secs(3600),
        ..PlannerConfig::default()
    }
}

fn full_plan(snap: &mut ClusterSnapshot, state: &mut PlannerState) -> Plan {
    let mut checker = PredicateChecker::new();
    plan(
        snap,
        &mut checker,
        &config(),
        jiff::Timestamp::UNIX_EPOCH,
        state,
        &Default::default(),
        &mut InstantStopwatch::start(),
    )
}

/// Cluster Autoscaler before parallel drain: each eligible node on a fresh copy, every pod
/// scanning all nodes in order with uncached predicates, no hints, no shared classes.
fn baseline(snap: &ClusterSnapshot, limit: Option<usize>) -> (usize, usize) {
    let cfg = config();
    let deleted = Default::default();
    let mut pdbs = PdbTracker::new(snap);
    let mut removable = 0;
    let mut evaluated = 0;
    for n in 0..snap.node_count() as NodeId {
        let load = eligibility::load(
            snap,
            n,
            cfg.utilization,
            cfg.utilization_threshold,
            &cfg.accelerators,
        );
        if check_node(snap, n, &deleted, load).is_err() {
            continue;
        }
        if limit.is_some_and(|l| evaluated >= l) {
            break;
        }
        evaluated += 1;
        let mut copy = snap.clone();
        let mut checker = PredicateChecker::without_cache();
        let Ok(pods) = pods_to_move(&copy, n, &cfg.rules, &mut pdbs) else {
            continue;
        };
        let mut ok = true;
        for p in pods {
            let mut placed = false;
            for d in 0..copy.node_count() as NodeId {
                if d != n && checker.check(&copy, p, d).is_ok() {
                    copy.place(p, Some(d));
                    placed = true;
                    break;
                }
            }
            if !placed {
                ok = false;
                break;
            }
        }
        removable += usize::from(ok);
    }
    (removable, evaluated)
}

fn time<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn main() {
    let model_nodes: Vec<usize> = std::env::var("EBB_BENCH_MODEL_NODES")
        .unwrap_or_else(|_| "5000,20000".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    if std::env::var_os("EBB_BENCH_MODEL_ONLY").is_some() {
        model_summary(&model_nodes);
        return;
    }
    if let Ok(sizes) = std::env::var("EBB_BENCH_SCALE_SHAPE") {
        scale_summary(sizes.split(',').filter_map(|n| n.trim().parse().ok()), 10);
        return;
    }
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    let mut summary = Vec::new();
    for nodes in [1000usize, 5000] {
        let (objs, build_gen) = time(|| cluster(nodes, 0));
        let base_live = LIVE.load(Ordering::Relaxed);
        let (snap, build) = time(|| build_snapshot(&objs).unwrap_or_else(|e| panic!("{e}")));
        let snap_bytes = LIVE.load(Ordering::Relaxed) - base_live;
        let changed = build_snapshot(&cluster(nodes, 1)).unwrap_or_else(|e| panic!("{e}"));
        drop(objs);

        // Full plan: fresh state, cold caches.
        let mut group = c.benchmark_group(format!("planner/{nodes}-nodes"));
        group.bench_function("full", |b| {
            b.iter_batched_ref(
                || (snap.clone(), PlannerState::default()),
                |(s, st)| black_box(full_plan(s, st)),
                criterion::BatchSize::PerIteration,
            )
        });
        // Incremental: state (hints, candidate times) from a plan of the previous snapshot.
        let mut warm = PlannerState::default();
        full_plan(&mut snap.clone(), &mut warm);
        group.bench_function("incremental-1pct", |b| {
            b.iter_batched_ref(
                || (changed.clone(), warm.clone()),
                |(s, st)| black_box(full_plan(s, st)),
                criterion::BatchSize::PerIteration,
            )
        });
        group.finish();

        // Figures for the summary (own timing, median of 5).
        let mut fulls = Vec::new();
        let mut result = Plan::default();
        for _ in 0..5 {
            let mut s = snap.clone();
            let (p, d) = time(|| full_plan(&mut s, &mut PlannerState::default()));
            fulls.push(d);
            result = p;
        }
        let mut incs = Vec::new();
        for _ in 0..5 {
            let mut s = changed.clone();
            let mut st = warm.clone();
            incs.push(time(|| full_plan(&mut s, &mut st)).1);
        }
        let mut s = snap.clone();
        PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
        let before = LIVE.load(Ordering::Relaxed);
        full_plan(&mut s, &mut PlannerState::default());
        let plan_peak = PEAK.load(Ordering::Relaxed) - before;
        // Baseline: all eligible nodes at 1,000; a sample of 100 at 5,000, extrapolated.
        let limit = (nodes > 1000).then_some(100);
        let ((base_removable, base_evaluated), base_time) = time(|| baseline(&snap, limit));
        let eligible = result.candidates.len()
            + result
                .unremovable
                .iter()
                .filter(|u| u.reason != ebb_api::reasons::UnremovableReason::NotUnderutilized)
                .count();
        let base_full = base_time.mul_f64(eligible as f64 / base_evaluated.max(1) as f64);
        let full = median(fulls);
        summary.push(format!(
            "{nodes} nodes, {} pods: snapshot build {:.0} ms ({:.0} MiB; objects generated in {:.1} s)\n  \
             full plan {:.1} ms ({} candidates, {} nodes evaluated)\n  \
             incremental plan after 1 % of pods changed {:.1} ms\n  \
             peak extra memory during a plan {:.1} MiB\n  \
             baseline {:.0} ms for {} of {} eligible nodes ({} removable){}\n  \
             speed-up over baseline {:.0}×",
            nodes * PODS_PER_NODE,
            build.as_secs_f64() * 1e3,
            mib(snap_bytes),
            build_gen.as_secs_f64(),
            full.as_secs_f64() * 1e3,
            result.candidates.len(),
            result.simulation.nodes_evaluated,
            median(incs).as_secs_f64() * 1e3,
            mib(plan_peak),
            base_time.as_secs_f64() * 1e3,
            base_evaluated,
            eligible,
            base_removable,
            if base_evaluated < eligible {
                format!(", extrapolated to all: {:.1} s", base_full.as_secs_f64())
            } else {
                String::new()
            },
            base_full.as_secs_f64() / full.as_secs_f64(),
        ));
    }
    c.final_summary();
    println!("\n== ebb planner benchmark summary ==");
    for s in summary {
        println!("{s}");
    }
    model_summary(&model_nodes);
    scale_summary([5000], 5);
}

/// The scale bench's cluster planned as its DryRun policy plans it (see `scale_shape.rs`).
fn scale_summary(sizes: impl IntoIterator<Item = usize>, loops: usize) {
    println!("\n== the scale bench's cluster, planned without a cluster ==");
    for nodes in sizes {
        for line in scale_shape::run(nodes, loops) {
            println!("{line}");
        }
    }
}

/// The shared cluster model against rebuilding a snapshot every loop (see `model.rs`).
fn model_summary(sizes: &[usize]) {
    println!("\n== shared cluster model vs rebuild every loop ({PODS_PER_NODE} pods per node) ==");
    for &nodes in sizes {
        for line in model::run(nodes) {
            println!("{line}");
        }
    }
}
