//! The versus bench's PDB-paced scenario in small on the real control plane: six nodes with one
//! pod each under a PDB allowing 2 unavailable, judged as the bench judges it; ebb once on kwok
//! nodes, once on nodes Karpenter launched (ebb deleting their NodeClaims), and Cluster
//! Autoscaler on kwok nodes: built from the checkouts `EBB_CA_SOURCE` and `EBB_CA_APIS_SOURCE`
//! name (or `EBB_CA_BIN`); without them that test is ignored, saying what to set.

use std::time::Duration;

use ebb_bench::versus::{
    self, Column, Measured, Nodes, Outcome, Scaler, Settings, cluster_autoscaler, scenario,
};

fn small() -> (scenario::Scenario, Settings) {
    let mut s = scenario::pdb_paced(6);
    s.cap = Duration::from_secs(180);
    let settings = Settings {
        scan_interval: Duration::from_secs(2),
        unneeded_time: Duration::from_secs(5),
        ..Settings::default()
    };
    (s, settings)
}

/// Runs `column` on the small pool and checks what holds for every scaler: each removed node was
/// drained through the Eviction API, no budget was broken, every pod came back, and the audit
/// log's Node deletions agree with the final count.
async fn run_small(s: &scenario::Scenario, settings: &Settings, column: Column) -> Measured {
    let outcome = versus::run_on(s, column, settings).await.unwrap();
    let Outcome::Ran(m) = outcome else {
        panic!("{} did not run: {outcome:?}", column.name());
    };
    eprintln!(
        "{}",
        versus::table(s, &[(column.name(), Outcome::Ran(m.clone()))])
    );
    let m = *m;
    assert_eq!(
        m.nodes_after,
        6 - m.node_deletes,
        "the audit log's Node deletions and the final count agree: {m:?}"
    );
    assert!(m.nodes_after >= 1, "the pods need a node: {m:?}");
    assert_eq!(m.node_launches, 0, "no node was added: {m:?}");
    assert!(!m.cut, "the node count settled before the cap: {m:?}");
    assert!(m.time_to_final.is_some(), "{m:?}");
    // Every pod on a removed node left through the Eviction API, none was deleted directly.
    assert!(m.evictions >= m.node_deletes, "{m:?}");
    assert_eq!(m.direct_pod_deletes, 0, "{m:?}");
    assert_eq!(m.pdb_violations, 0, "{m:?}");
    assert_eq!(m.never_came_back, 0, "{m:?}");
    assert!(
        m.cpu_seconds.is_some_and(|c| c > 0.0),
        "the scaler's CPU time was read: {m:?}"
    );
    m
}

/// ebb on the small pool: six 250m pods fit on one 4-cpu node, so at least half of it goes.
async fn run_ebb(nodes: Nodes) -> Measured {
    let (s, settings) = small();
    let m = run_small(&s, &settings, Column::new(Scaler::Ebb, nodes)).await;
    assert!(
        m.node_deletes >= 3,
        "only {} of 6 nodes removed: {m:?}",
        m.node_deletes
    );
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ebb_consolidates_a_pdb_paced_pool_without_breaking_the_budget() {
    let m = run_ebb(Nodes::Kwok).await;
    assert_eq!(m.node_claim_deletes, 0, "{m:?}");
}

/// On Karpenter's nodes with their hostname label set to their name: as the KWOK provider
/// leaves them (hostname label = the NodeClaim's name), ebb 0.1.0 abandoned every drain (its
/// re-check of a tainted node selected it by that label and found no node).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ebb_hands_a_pdb_paced_karpenter_pool_back_through_its_node_claims() {
    let m = run_ebb(Nodes::KarpenterHostnameIsName).await;
    // removal.method Auto on Karpenter's nodes: ebb deleted each removed node's NodeClaim, and
    // Karpenter (with consolidateAfter Never) deleted the Node and nothing else.
    assert_eq!(m.node_claim_deletes, m.node_deletes, "{m:?}");
    assert!(m.karpenter_cpu_seconds.is_some(), "{m:?}");
    assert!(
        m.notes
            .iter()
            .any(|n| n == "Karpenter's disruption decisions: none"),
        "Karpenter disrupted nodes by itself: {:?}",
        m.notes
    );
}

/// Cluster Autoscaler (kwok provider, the bench's flags) on the same small pool. Its settle
/// window here is 45 s, not the bench's (which outlasts its 5-minute unremovable-node recheck):
/// this checks that it runs and removes nodes without breaking the budget, not how far it gets.
/// Cluster Autoscaler is built from source checkouts the Go module proxy cannot give (see
/// e2e/k8s/README.md), so the test runs only when they are named: with `EBB_CA_SOURCE` and
/// `EBB_CA_APIS_SOURCE` set (or `EBB_CA_BIN`) when the tests are built, it is part of the suite
/// and builds Cluster Autoscaler first; otherwise it is ignored with the reason below, and
/// `cargo test -p ebb-bench --test versus_smoke -- --ignored` runs it to fail naming what is
/// missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(ebb_ca),
    ignore = "needs Cluster Autoscaler: set EBB_CA_SOURCE and EBB_CA_APIS_SOURCE to its checkouts (docs/testing.md, Cluster Autoscaler in versus_smoke)"
)]
async fn cluster_autoscaler_removes_nodes_of_a_pdb_paced_pool_without_breaking_the_budget() {
    if let Err(why) = build_cluster_autoscaler() {
        panic!("Cluster Autoscaler: {why}");
    }
    if let Err(why) = cluster_autoscaler::checked_binary() {
        panic!(
            "Cluster Autoscaler {why}\nSet EBB_CA_SOURCE and EBB_CA_APIS_SOURCE to checkouts of \
             {} at {} and of kubernetes/autoscaler at {} (e2e/k8s/README.md, Cluster Autoscaler), \
             or EBB_CA_BIN to a binary built from them.",
            cluster_autoscaler::REPOSITORY,
            cluster_autoscaler::EXPECTED_COMMIT,
            cluster_autoscaler::APIS_COMMIT,
        );
    }
    let (mut s, settings) = small();
    s.settle = Some(Duration::from_secs(45));
    let m = run_small(
        &s,
        &settings,
        Column::new(Scaler::ClusterAutoscaler, Nodes::Kwok),
    )
    .await;
    assert!(
        m.node_deletes >= 1,
        "Cluster Autoscaler removed no node: {m:?}"
    );
    assert!(
        m.notes
            .iter()
            .any(|n| n.starts_with("Cluster Autoscaler's log:") && !n.contains(" 0 removals")),
        "its log shows its removals: {:?}",
        m.notes
    );
}

/// `e2e/k8s/build.sh peers cluster-autoscaler` when `EBB_CA_SOURCE` names the checkouts to build
/// from (it builds nothing when the binary's stamp says it is up to date); nothing otherwise.
fn build_cluster_autoscaler() -> Result<(), String> {
    if std::env::var_os("EBB_CA_SOURCE").is_none() {
        return Ok(());
    }
    let script = ebb_e2e::harness::k8s_script("build.sh");
    let status = std::process::Command::new("bash")
        .arg(&script)
        .args(["peers", "cluster-autoscaler"])
        .status()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} peers cluster-autoscaler failed ({status}); its output above says why",
            script.display()
        ))
    }
}
